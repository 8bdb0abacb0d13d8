"""``placement: local``: both workflows run in this process, and compute what one Ray rank per component does.

The reference is the same seeded tiny run on Ray with every component on device 0, one rank each:
metrics (all but timings) are equal and the trained weights are ``torch.equal``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from m2flow.workflows.embodied.config import EmbodiedConfig
from m2flow.workflows.reasoning.config import ReasoningConfig
from tests.workflows.embodied import setup as embodied_setup
from tests.workflows.reasoning.setup import toy_config

pytestmark = pytest.mark.timeout(900)

REASONING_ONE_DEVICE = "actor,rollout,inference,reward: 0"
EMBODIED_ONE_DEVICE = "env,rollout,actor: 0"


def _computed(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """The metrics a run computes, without its timings and rates (which differ run to run)."""
    return [{k: v for k, v in h.items() if not k.startswith(("time/", "perf/"))} for h in history]


def _checkpoint_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """Every weight tensor of the last checkpoint of a run (safetensors files and the embodied actor file)."""
    from safetensors.torch import load_file

    (last,) = sorted((run_dir / "checkpoints").iterdir())[-1:]
    out: dict[str, torch.Tensor] = {}
    for f in sorted(last.rglob("*.safetensors")):
        out.update({f"{f.relative_to(last)}:{k}": v for k, v in load_file(f).items()})
    for f in sorted(last.rglob("actor.pt")):
        state = torch.load(f, weights_only=False)["policy"]
        out.update({f"{f.relative_to(last)}:{k}": v for k, v in state.items()})
    return out


def _left_behind(before: set[threading.Thread], wait_s: float = 5.0) -> list[str]:
    """The m2flow threads started since ``before`` that are still alive after up to ``wait_s``
    (a closed listener's accept thread ends on its next wake-up, not at once)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = sorted(t.name for t in set(threading.enumerate()) - before
                      if t.name.startswith("m2flow-") and t.is_alive())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _assert_same(local: tuple[list, dict], ray_run: tuple[list, dict]) -> None:
    (h_local, w_local), (h_ray, w_ray) = local, ray_run
    assert len(h_local) == len(h_ray) > 0
    assert _computed(h_local) == _computed(h_ray)
    assert w_local and sorted(w_local) == sorted(w_ray)
    different = [k for k in w_local if not torch.equal(w_local[k], w_ray[k])]
    assert different == []


# ----------------------------------------------------------------------------- configs accept 'local'


def test_configs_accept_the_local_placement(tmp_path) -> None:
    cfg = toy_config(tmp_path, "local")
    cfg.validate()
    assert isinstance(cfg, ReasoningConfig) and cfg.placement == "local"
    emb = embodied_setup.toy_config(tmp_path, placement="local")
    emb.validate()
    plan = emb.placed()
    assert isinstance(emb, EmbodiedConfig) and plan.mode == "collocated"
    assert {c: [r.local_devices for r in plan[c].ranks] for c in plan.components} == {
        "env": [(0,)], "rollout": [(0,)], "actor": [(0,)]}


def test_local_runs_without_ray(tmp_path) -> None:
    import ray

    from m2flow.autoplan.entry import train
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING

    was_up = ray.is_initialized()
    before = set(threading.enumerate())
    result = train(REASONING, toy_config(tmp_path, "local", steps=2))
    assert result.mode == "collocated" and len(result.history) == 2
    assert ray.is_initialized() == was_up  # nothing started Ray
    assert _left_behind(before) == []  # channel hosts, connections and listeners all ended
    logs = sorted(p.name for p in (tmp_path / "run" / "logs").iterdir())
    assert logs and all(name.endswith(".0.log") for name in logs)  # one log file per in-process rank


# ----------------------------------------------------------------------------- local == one Ray rank each


def _reasoning(root: Path, placement: str, cluster: Any, overrides: dict[str, Any]) -> tuple[list, dict]:
    from m2flow.autoplan.entry import train
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING

    cfg = toy_config(root, placement, steps=3, checkpoint_every=3, **overrides)
    result = train(REASONING, cfg, cluster=cluster)
    return result.history, _checkpoint_weights(Path(cfg.run_dir))


REASONING_VARIANTS = {
    # rollout generating in the actor with the hf backend; reward scored in the rollout
    "fused": {},
    # a rollout worker of its own (weight sync, channels between workers) on the lean backend
    "separate-rollout": {"rollout": {"fuse_with_actor": False, "backend": "lean"}},
}


@pytest.mark.ray
@pytest.mark.parametrize("variant", list(REASONING_VARIANTS))
def test_reasoning_local_equals_one_ray_rank_per_component(cluster, tmp_path, variant) -> None:
    overrides = REASONING_VARIANTS[variant]
    local = _reasoning(tmp_path / "local", "local", None, overrides)
    on_ray = _reasoning(tmp_path / "ray", REASONING_ONE_DEVICE, cluster, overrides)
    _assert_same(local, on_ray)


def _embodied(root: Path, placement: str, cluster: Any) -> tuple[list, dict]:
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED

    cfg = embodied_setup.toy_config(root, placement=placement, total_env_steps=3 * 512, checkpoint_every=3)
    result = train(EMBODIED, cfg, cluster=cluster)
    assert result.plan.fused("rollout")  # env and rollout on one device: the policy runs in the env worker
    return result.history, _checkpoint_weights(Path(cfg.run_dir))


@pytest.mark.ray
def test_embodied_local_equals_one_ray_rank_per_component(cluster, tmp_path) -> None:
    local = _embodied(tmp_path / "local", "local", None)
    on_ray = _embodied(tmp_path / "ray", EMBODIED_ONE_DEVICE, cluster)
    _assert_same(local, on_ray)
