"""A tiny agentic config for tests: guess-the-number in 1-8, a 2-layer model, two groups of two episodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from m2flow.config import from_dict
from m2flow.config.convert import set_dotted
from m2flow.workflows.agentic.config import AgenticConfig

ENVS = "tests.workflows.agentic.envs"


def tiny_config(tmp_path: Path, model: Path | None = None, **overrides: Any) -> AgenticConfig:
    """A run of 3 iterations on the local executor; ``overrides`` are dotted keys."""
    data: dict[str, Any] = {
        "placement": "local", "run_dir": str(tmp_path / "run"), "steps": 3, "seed": 0,
        "metrics": {"sinks": ["jsonl"]}, "eval_episodes": 4,
        "model": {"path": str(model or tmp_path / "model"), "create_tiny": True,
                  "tiny": {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}},
        "env": {"name": "guess_number", "kwargs": {"high": 8, "max_turns": 4}, "eval_kwargs": {}, "imports": [ENVS]},
        "episodes": {"groups_per_step": 2, "group_size": 2},
        "rollout": {"max_turns": 4, "max_tokens": 40, "max_turn_tokens": 4, "stop": [" "]},
        "actor": {"micro_batch_size": 4, "optim": {"lr": 1e-3}},
        "algorithm": {"adv_estimator": "grpo", "old_logprobs": "rollout"},
    }
    return from_dict(AgenticConfig, set_dotted(data, overrides))


def comparable(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """Metrics that must not depend on where or when a run executes (no timings, rates, restarts)."""
    return [{k: v for k, v in h.items() if not k.startswith(("time/", "perf/"))} for h in history]
