"""The workflows' command: ``m2flow eval CHECKPOINT``.

``eval`` evaluates a saved checkpoint, whichever workflow wrote it.

A reasoning checkpoint (or model directory): greedy accuracy and mean response length on a dataset.
An embodied checkpoint (``runs/.../checkpoints/step_N``): mean raw return of the policy over whole
episodes with deterministic actions, under the run's own env config and normalisation statistics.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from m2flow.commands import CommandError, register_command, say


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path,
                        help="a model directory, or a training checkpoint (runs/.../checkpoints/step_N)")
    parser.add_argument("--config", type=Path, default=None,
                        help="a reasoning training YAML: its data, reward and sampling lengths are the defaults")
    parser.add_argument("--episodes", type=int, default=10, help="embodied checkpoints: episodes to average over")
    parser.add_argument("--output", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="eval config overrides, e.g. data.kind=gsm8k data.path=DIR limit=100; "
                             "for an embodied checkpoint, overrides of its run config, e.g. env.num_envs=1")


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _defaults_from_training(path: Path) -> dict[str, Any]:
    from m2flow.config import to_dict
    from m2flow.driver.registry import load_workflow_config

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


def _write(results: dict[str, float], output: Path | None) -> None:
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=1))


def _run(args: argparse.Namespace) -> int:
    from m2flow.driver.checkpoints import TRAINER_STATE, read_state

    if (args.checkpoint / TRAINER_STATE).is_file() and read_state(args.checkpoint).get("workflow") == "embodied":
        return _run_embodied(args)
    return _run_reasoning(args)


def _run_embodied(args: argparse.Namespace) -> int:
    from m2flow.workflows.embodied.flow import evaluate_checkpoint

    if args.config is not None:
        raise CommandError("--config is for reasoning checkpoints; an embodied checkpoint carries its own config "
                           "(change it with KEY=VALUE overrides)")
    if args.episodes < 1:
        raise CommandError(f"--episodes must be >= 1, got {args.episodes}")
    results = evaluate_checkpoint(args.checkpoint, episodes=args.episodes, overrides=args.overrides)
    if not results.get("eval/episodes"):
        raise CommandError(f"no episode of {args.checkpoint} finished")
    say(f"{args.checkpoint}: mean return {results['eval/return']:.2f} (std {results['eval/return_std']:.2f}), "
        f"mean length {results['eval/length']:.1f} over {int(results['eval/episodes'])} episodes")
    _write(results, args.output)
    return 0


def _run_reasoning(args: argparse.Namespace) -> int:
    from m2flow.config import from_dict
    from m2flow.config.loader import compose
    from m2flow.workers.actor import SHARDS, whole_model_dir
    from m2flow.workflows.reasoning.evaluation import EvalConfig, evaluate_checkpoint

    base = _defaults_from_training(args.config) if args.config is not None else {}
    cfg = from_dict(EvalConfig, _merge(base, compose(None, args.overrides, EvalConfig)))
    path = model_dir(args.checkpoint)
    if not (path / "config.json").is_file():
        raise CommandError(f"{args.checkpoint} holds no model (no config.json)")
    if (path / SHARDS).is_dir():  # a sharded (FSDP) checkpoint: put its weights together in a scratch copy
        with tempfile.TemporaryDirectory(prefix="m2flow-eval-") as scratch:
            results = evaluate_checkpoint(str(whole_model_dir(path, Path(scratch))), cfg)
    else:
        results = evaluate_checkpoint(str(path), cfg)
    say(f"{path}: accuracy {results['eval/accuracy']:.4f}, mean length {results['eval/response_length']:.2f} "
        f"tokens over {int(results['eval/prompts_count'])} prompts ({cfg.data.kind}, {cfg.split})")
    _write(results, args.output)
    return 0


register_command("eval", "evaluate a checkpoint: accuracy on a dataset (reasoning) or mean return (embodied)",
                 _configure, _run)
