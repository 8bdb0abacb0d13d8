"""Configs of tiny reasoning runs shared by the end-to-end tests: a learnable toy reward, few steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from m2flow.config import from_dict
from m2flow.driver.run import Run
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.reasoning.workflow import WORKFLOW


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def toy_config(root: Path, placement: str, **overrides: Any) -> ReasoningConfig:
    """GRPO on arithmetic prompts with the '7'-fraction reward: 8 prompts x 8 responses per iteration."""
    base = {
        "placement": placement,
        "model": {"path": str(root / "model"), "create_tiny": True,
                  "tiny": {"hidden_size": 32, "intermediate_size": 64, "seed": 1}},
        "data": {"prompts_per_step": 8, "arithmetic": {"train_size": 64, "test_size": 16}},
        "rollout": {"sampling": {"n": 8, "max_new_tokens": 8}},
        "reward": {"fn": "tests.workflows.toy_reward:target_fraction"},
        "actor": {"optim": {"lr": 0.02}, "micro_batch_size": 16},
        "steps": 6,
        "run_dir": str(root / "run"),
        "metrics": {"sinks": ["jsonl"]},
    }
    return from_dict(ReasoningConfig, _merge(base, overrides))


def improved(history: list[dict[str, float]], key: str = "reward/mean", margin: float = 0.05) -> bool:
    """True when the mean of the last two iterations beats the first two by ``margin``."""
    first = sum(h[key] for h in history[:2]) / 2
    last = sum(h[key] for h in history[-2:]) / 2
    return last > first + margin


def train_partial(cfg: ReasoningConfig, cluster: Any = None) -> tuple[list, list, list[int], list[int]]:
    """Train ``cfg``; (history, the groups the actor took, the dataset indices put, those still carried at
    the end)."""
    put: list[int] = []
    with Run(WORKFLOW, cfg, cluster) as run:
        flow = run.flow
        put_prompts = flow.put_prompts

        def recording(step, items):
            put.extend(item.index for item in items)
            return put_prompts(step, items)

        flow.put_prompts = recording
        result = run.train()
        received = flow.actor.received_groups().wait()
        carried = flow.rollout.carried_prompts().wait()
    return result.history, [g for rank in received for g in rank], put, sum(carried, [])
