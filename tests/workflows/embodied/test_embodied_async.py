"""The embodied workflow with bounded staleness: the schedule, learning, exact equality with the
synchronous flow where nothing may run ahead, and resume that loses and duplicates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from m2flow.autoplan.entry import train
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
from tests.workflows.embodied.setup import LEARNING, toy_config

pytestmark = pytest.mark.timeout(900)


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    (last,) = sorted((Path(run_dir) / "checkpoints").iterdir())[-1:]
    return torch.load(last / "actor.pt", weights_only=False)["policy"]


def _learning(history: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in h.items() if not k.startswith(("time/", "async/"))} for h in history]


# ----------------------------------------------------------------------------- whole runs


@pytest.mark.learning
def test_staleness_1_learns_and_trains_every_sample_once(cluster, tmp_path):
    # The policy in the env process, the actor on a device of its own: collection overlaps updates.
    cfg = toy_config(tmp_path, placement="env,rollout: 0, actor: 1", **{"algorithm.max_staleness": 1})
    result = train(EMBODIED, cfg, cluster=cluster)
    h = result.history
    returns = [x["env/episode_return"] for x in h]
    assert returns[0] < 1.0 and returns[-1] > 1.5, returns
    assert [x["async/staleness_max"] for x in h] == [0.0] + [1.0] * 5  # iteration 0 has nothing older
    assert all(x["async/dropped_samples"] == 0.0 for x in h)
    assert sum(x["actor/batch_size"] for x in h) == h[-1]["env/total_steps"] == 6 * 512  # each sample once
    assert all(x["async/importance_weight_mean"] > 0 for x in h[1:])


def test_staleness_that_may_never_run_ahead_equals_the_synchronous_flow(tmp_path):
    # Evaluating after every iteration drains the pipeline every iteration: with staleness 1 every
    # collection then uses the newest weights, and the run must equal the synchronous one exactly.
    sync = toy_config(tmp_path / "sync", placement="local", eval_every=1, eval_episodes=2, checkpoint_every=6)
    drained = toy_config(tmp_path / "s1", placement="local", eval_every=1, eval_episodes=2, checkpoint_every=6,
                         **{"algorithm.max_staleness": 1})
    a, b = train(EMBODIED, sync), train(EMBODIED, drained)
    assert _learning(a.history) == _learning(b.history) and a.episodes == b.episodes
    assert all(x["async/staleness_max"] == 0.0 for x in b.history)
    wa, wb = _weights(sync.run_dir), _weights(drained.run_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_staleness_1_resumes_exactly(tmp_path):
    full_cfg = toy_config(tmp_path / "full", placement="local", checkpoint_every=3, **{"algorithm.max_staleness": 1})
    full = train(EMBODIED, full_cfg)
    checkpoint = Path(full_cfg.run_dir) / "checkpoints" / "step_000003"
    resumed_cfg = toy_config(tmp_path / "resumed", placement="local", resume=str(checkpoint), checkpoint_every=3,
                             **{"algorithm.max_staleness": 1})
    resumed = train(EMBODIED, resumed_cfg)
    assert len(resumed.history) == 3
    for a, b in zip(full.history[3:], resumed.history):
        for key in LEARNING + ("async/staleness_max", "async/age_1_samples"):
            assert a.get(key) == b.get(key), key
    # nothing lost, nothing twice: the resumed run trains exactly the env steps after the checkpoint
    assert sum(x["actor/batch_size"] for x in resumed.history) == 3 * 512
    assert [x["env/total_steps"] for x in resumed.history] == [4 * 512, 5 * 512, 6 * 512]
    assert resumed.episodes == full.episodes
    wa, wb = _weights(full_cfg.run_dir), _weights(resumed_cfg.run_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
