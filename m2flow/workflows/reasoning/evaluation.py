"""Held-out evaluation: greedy responses scored by the run's reward (accuracy, mean length).

Used during training (the rollout workers generate, the driver scores) and by ``m2flow eval`` on a
saved checkpoint or model directory (everything in this process; ``evaluate_saved``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from m2flow.config.errors import ConfigError
from m2flow.config.schema import option
from m2flow.workflows.reasoning.config import DataConfig
from m2flow.workers.config import RewardConfig

if TYPE_CHECKING:
    from m2flow.driver.workflow import CheckpointEval, EvalOptions

log = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    """Evaluate a checkpoint on a dataset: greedy decoding, scored by a reward."""

    data: DataConfig = option(DataConfig(), "the dataset (its held-out split unless split says otherwise)")
    split: str = option("test", "'test' (held-out) or 'train'")
    limit: int | None = option(None, "evaluate only the first this-many prompts")
    reward: RewardConfig = option(RewardConfig(), "how responses are scored")
    max_new_tokens: int = option(32, "most tokens per response")
    stop: list[str] = option([], "strings that end a response")
    batch_size: int = option(64, "prompts per generate call")

    def validate(self) -> None:
        if self.split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {self.split!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def score_responses(texts: Sequence[str], lengths: Sequence[int], answers: Sequence[str | None],
                    reward_fn: Any) -> dict[str, float]:
    """Accuracy (reward >= 1), mean reward and mean length of responses to prompts with ``answers``."""
    scores = reward_fn(list(texts), [a or "" for a in answers]) if texts else []
    n = max(1, len(scores))
    return {
        "eval/accuracy": sum(1.0 for s in scores if s >= 1.0) / n,
        "eval/reward_mean": sum(scores) / n,
        "eval/response_length": sum(lengths) / max(1, len(lengths)),
        "eval/prompts_count": float(len(scores)),
    }


def evaluate_checkpoint(path: str, cfg: EvalConfig) -> dict[str, float]:
    """Load a checkpoint directory (model + tokenizer) here and evaluate it on ``cfg.data``."""
    from m2flow.backends.generation import SamplingParams, create_generation_backend
    from m2flow.models.weight_files import check_max_new_tokens
    from m2flow.workflows.reasoning.data import prompt_dataset, raw_records
    from m2flow.workers.reward import build_reward_fn

    backend: Any = create_generation_backend("hf", path)
    check_max_new_tokens("max_new_tokens", cfg.max_new_tokens, backend.module)
    records = raw_records(cfg.data, cfg.split)
    if not records:
        raise ConfigError("split", f"the data has no {cfg.split!r} split (a file's held-out split is data.eval_path; "
                                   "split=train evaluates on the training data)")
    dataset = prompt_dataset(cfg.data, records, backend.tokenizer)
    items = list(dataset)[: cfg.limit] if cfg.limit is not None else list(dataset)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, stop=tuple(cfg.stop))
    texts: list[str] = []
    lengths: list[int] = []
    for start in range(0, len(items), cfg.batch_size):
        chunk = items[start : start + cfg.batch_size]
        for group in backend.generate([it.prompt_ids for it in chunk], params):
            texts.append(group.responses[0].text or "")
            lengths.append(len(group.responses[0].token_ids))
        log.info("evaluated %d/%d prompts", len(texts), len(items))
    return score_responses(texts, lengths, [it.answer for it in items], build_reward_fn(cfg.reward))


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _defaults_from_training(path: Path) -> dict[str, Any]:
    """The eval config's defaults from a reasoning training config: its data, reward and sampling lengths."""
    from m2flow.config import to_dict
    from m2flow.driver.registry import load_workflow_config

    _, cfg = load_workflow_config(path)
    if not hasattr(cfg, "data") or not hasattr(cfg, "rollout"):
        raise ValueError(f"{path} is not a reasoning training config")
    sampling = cfg.rollout.sampling
    return {"data": to_dict(cfg.data), "reward": to_dict(cfg.reward),
            "max_new_tokens": sampling.max_new_tokens, "stop": list(sampling.stop)}


def evaluate_saved(checkpoint: Path, options: EvalOptions) -> CheckpointEval:
    """``m2flow eval`` on a model directory or a reasoning checkpoint: the eval config is ``options.config``'s
    data, reward and lengths (if given) under ``options.overrides``."""
    from m2flow.commands import CommandError
    from m2flow.config import from_dict
    from m2flow.config.loader import compose
    from m2flow.driver.workflow import CheckpointEval
    from m2flow.workflows.saved_model import loadable_model, model_dir

    base = _defaults_from_training(options.config) if options.config is not None else {}
    cfg = from_dict(EvalConfig, _merge(base, compose(None, list(options.overrides), EvalConfig)))
    path = model_dir(checkpoint)
    if not (path / "config.json").is_file():
        raise CommandError(f"{checkpoint} holds no model (no config.json)")
    with loadable_model(path) as whole:
        results = evaluate_checkpoint(str(whole), cfg)
    return CheckpointEval(results, f"{path}: accuracy {results['eval/accuracy']:.4f}, mean length "
                                   f"{results['eval/response_length']:.2f} tokens over "
                                   f"{int(results['eval/prompts_count'])} prompts ({cfg.data.kind}, {cfg.split})")
