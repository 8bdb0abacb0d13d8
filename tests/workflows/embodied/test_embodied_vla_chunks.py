"""The embodied workflow with action chunks: a tiny VLA emitting chunks of 4 actions, decoded in parallel, on
MetaWorld pixels in this process (``placement: local``). Env steps, decisions and rendered frames are counted.
Skipped, with the reason, where MetaWorld or an offscreen OpenGL (EGL / OSMesa) is missing."""

from __future__ import annotations

import math

import pytest

from m2flow.autoplan.entry import train
from m2flow.envs.metaworld import OffscreenCamera, metaworld_unavailable_reason
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
from tests.workflows.embodied.test_embodied_vla import vla_config

REASON = metaworld_unavailable_reason()
pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(REASON is not None, reason=f"MetaWorld pixels unavailable: {REASON}")]


@pytest.fixture
def frames(monkeypatch) -> list[int]:
    """Counts every camera frame rendered in this process."""
    count = [0]
    render = OffscreenCamera.render

    def counted(self, data):
        count[0] += 1
        return render(self, data)

    monkeypatch.setattr(OffscreenCamera, "render", counted)
    return count


@pytest.mark.parametrize("advantage", ["gae", "grpo"])
def test_chunks_of_four_run_end_to_end_counting_env_steps(tmp_path, frames, advantage):
    # 2 envs, 4 decisions of 4 actions an iteration, 12-step episodes (3 decisions each), 2 iterations
    overrides = {"policy.vla.chunk": 4, "policy.vla.decoding": "parallel", "rollout_steps": 4,
                 "total_env_steps": 2 * 2 * 4 * 4, "checkpoint_every": 0, "algorithm.minibatch_size": 4}
    if advantage == "grpo":
        overrides.update({"algorithm.advantage": "grpo", "algorithm.use_critic": False, "algorithm.group_size": 2})
    result = train(EMBODIED, vla_config(tmp_path, **overrides))
    assert len(result.history) == 2
    last = result.history[-1]
    assert last["env/total_steps"] == 64  # env steps, not the 32 decisions
    assert last["actor/batch_size"] <= 8 and result.history[0]["actor/batch_size"] <= 8  # decisions trained on
    assert all(math.isfinite(h["actor/pg_loss"]) for h in result.history)
    episodes = sum(h["env/episodes"] for h in result.history)
    assert episodes == 4  # 3 decisions each: one ends per env per iteration
    # one frame per decision (16; an episode's true last frame is the one after its last chunk), and one per
    # reset: the 2 first ones, one after each ended episode and (GRPO) the resets starting each iteration
    resets = 2 + episodes + (2 * 2 if advantage == "grpo" else 0)
    assert frames[0] == 16 + resets, frames[0]


def test_evaluation_executes_whole_chunks(tmp_path, frames):
    from m2flow.envs import VecEnv
    from m2flow.models.policies import build_policy
    from m2flow.workers.embodied.evaluate import evaluate_policy

    cfg = vla_config(tmp_path, **{"policy.vla.chunk": 4, "env.env_kwargs.max_episode_steps": 10})
    probe = VecEnv(cfg.env)
    try:
        policy = build_policy(probe.single_observation_space, probe.single_action_space, cfg.policy)
    finally:
        probe.close()
    before = frames[0]
    out = evaluate_policy(cfg.env, cfg.policy, policy.state_dict(), None, episodes=2, seed=0)
    # 10-step episodes in chunks of 4: 4 + 4 + 2, the last chunk cut short by the time limit
    assert out["eval/episodes"] == 2 and out["eval/length"] == 10
    # per env: its reset, a frame after each of the first two chunks, the true last frame, the next reset
    assert frames[0] - before == 2 * 5
