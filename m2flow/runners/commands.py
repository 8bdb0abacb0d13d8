"""``m2flow eval CHECKPOINT``: greedy accuracy and mean response length of a checkpoint on a dataset."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from m2flow.cli import register_command


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path,
                        help="a model directory, or a training checkpoint (runs/.../checkpoints/step_N)")
    parser.add_argument("--config", type=Path, default=None,
                        help="a reasoning training YAML: its data, reward and sampling lengths are the defaults")
    parser.add_argument("--output", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="eval config overrides, e.g. data.kind=gsm8k data.path=DIR limit=100")


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _defaults_from_training(path: Path) -> dict[str, Any]:
    from m2flow.config import load_workflow_config, to_dict

    _, cfg = load_workflow_config(path)
    if not hasattr(cfg, "data") or not hasattr(cfg, "rollout"):
        raise ValueError(f"{path} is not a reasoning training config")
    sampling = cfg.rollout.sampling
    return {"data": to_dict(cfg.data), "reward": to_dict(cfg.reward),
            "max_new_tokens": sampling.max_new_tokens, "stop": list(sampling.stop)}


def model_dir(checkpoint: Path) -> Path:
    """The model directory inside a training checkpoint, or the path itself."""
    from m2flow.workers.actor import ACTOR_DIR

    return checkpoint / ACTOR_DIR if (checkpoint / ACTOR_DIR / "config.json").is_file() else checkpoint


def _run(args: argparse.Namespace) -> int:
    from m2flow.config import from_dict
    from m2flow.config.loader import compose
    from m2flow.runners.evaluation import EvalConfig, evaluate_checkpoint

    base = _defaults_from_training(args.config) if args.config is not None else {}
    cfg = from_dict(EvalConfig, _merge(base, compose(None, args.overrides, EvalConfig)))
    path = model_dir(args.checkpoint)
    if not (path / "config.json").is_file():
        print(f"error: {args.checkpoint} holds no model (no config.json)", file=sys.stderr)
        return 1
    results = evaluate_checkpoint(str(path), cfg)
    print(f"{path}: accuracy {results['eval/accuracy']:.4f}, mean length {results['eval/response_length']:.2f} "
          f"tokens over {int(results['eval/prompts_count'])} prompts ({cfg.data.kind}, {cfg.split})")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=1))
    return 0


register_command("eval", "accuracy and mean response length of a checkpoint on a dataset", _configure, _run)
