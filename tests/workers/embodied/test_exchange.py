"""Env <-> rollout exchange in every plan: each env step's transition reaches the actor exactly once."""

from __future__ import annotations

import importlib
import uuid

import numpy as np
import pytest

from m2flow.envs import EnvConfig, make_env
from m2flow.models.policies import PolicyConfig
from m2flow.runtime import WorkerGroup, Worker
from m2flow.workers.embodied.env import EnvWorker
from m2flow.workers.embodied.rollout import RolloutWorker
from m2flow.workers.embodied.settings import EmbodiedEnvSettings, EmbodiedRolloutSettings

TOY = "tests.workers.embodied.toy_envs"
T = 12


class Recorder(Worker):
    """Stands in for the actor: receives every env rank's trajectory of an iteration."""

    def __init__(self, env_group: str, env_ranks: int) -> None:
        self.env_group = env_group
        self.env_ranks = env_ranks

    def collect(self, iteration: int) -> list:
        return [self.comm.recv(self.env_group, e) for e in range(self.env_ranks)]


def _expected(count_before: int, steps: int) -> dict[str, np.ndarray]:
    """Flags of CounterEnv (episodes: 5 steps, or ended when the count is a multiple of 7)."""
    term, trunc, length = [], [], 0
    for j in range(steps):
        count = count_before + j + 1
        length += 1
        term.append(count % 7 == 0)
        trunc.append(length == 5)
        if term[-1] or trunc[-1]:
            length = 0
    return {"terminated": np.array(term), "truncated": np.array(trunc)}


def _launch(cluster, stages: int, fused: bool, env_ranks: int, num_envs: int):
    rid = uuid.uuid4().hex[:6]
    names = {c: f"{c}-x{rid}" for c in ("env", "rollout", "actor")}
    env_cfg = EnvConfig(env_id="M2flowToy/Counter-v0", num_envs=num_envs, num_groups=stages,
                        normalize_obs=False, normalize_reward=False)
    policy = PolicyConfig(hidden_sizes=[8])
    importlib.import_module(TOY)  # the toy env ids, for the probe env built here
    probe = make_env(env_cfg)
    spaces = probe.observation_space, probe.action_space
    probe.close()
    rollout_settings = EmbodiedRolloutSettings(obs_space=spaces[0], action_space=spaces[1], policy=policy, seed=0,
                                               env_group=names["env"], env_ranks=env_ranks, stages=stages,
                                               rollout_steps=T)
    env_settings = EmbodiedEnvSettings(env=env_cfg, rollout_steps=T, actor_group=names["actor"], actor_ranks=1,
                                       imports=(TOY,), rollout_group=None if fused else names["rollout"],
                                       rollout_ranks=1)
    kwargs = {"settings": env_settings, "hosted": {"rollout": rollout_settings} if fused else None}
    env = WorkerGroup(EnvWorker, cluster, names["env"], num_ranks=env_ranks, kwargs=kwargs)
    groups = [env]
    rollout = None
    if not fused:
        rollout = WorkerGroup(RolloutWorker, cluster, names["rollout"], num_ranks=1,
                              kwargs={"settings": rollout_settings})
        groups.append(rollout)
    actor = WorkerGroup(Recorder, cluster, names["actor"], num_ranks=1, args=(names["env"], env_ranks))
    groups.append(actor)
    return env, rollout, actor, groups


@pytest.mark.parametrize(("stages", "fused", "env_ranks", "num_envs"), [
    (3, False, 2, 4),   # one rollout rank serves two env ranks; uneven stages of 1, 2, 1 envs
    (2, True, 2, 3),    # the policy inside the env process
])
def test_every_transition_reaches_the_actor_once(cluster, stages, fused, env_ranks, num_envs):
    env, rollout, actor, groups = _launch(cluster, stages, fused, env_ranks, num_envs)
    try:
        for it in range(2):
            handles = [env.interact(it), actor.collect(it)]
            if rollout is not None:
                handles.append(rollout.act(it))
            stats, (trajs,) = handles[0].wait(), handles[1].wait()
            for h in handles[2:]:
                h.wait()
            assert [s.steps for s in stats] == [T * num_envs] * env_ranks
            for rank, traj in enumerate(trajs):
                assert traj.env_rank == rank and traj.iteration == it
                assert traj.obs.shape == (T, num_envs, 2) and traj.actions.shape == (T, num_envs, 1)
                finals = {(int(t), int(e)): o for (t, e), o in zip(traj.final_index, traj.final_obs)}
                for e in range(num_envs):
                    uid = rank * num_envs + e  # the env's seed: the run's seed 0 + rank * n + e
                    counts = np.arange(it * T, (it + 1) * T)
                    # the observations acted on: this env's steps in order, none missing or repeated
                    assert np.array_equal(traj.obs[:, e, 0], np.full(T, uid))
                    assert np.array_equal(traj.obs[:, e, 1], counts)
                    assert np.array_equal(traj.rewards[:, e], counts + 1)
                    want = _expected(0, (it + 1) * T)
                    assert np.array_equal(traj.terminated[:, e], want["terminated"][it * T:])
                    assert np.array_equal(traj.truncated[:, e], want["truncated"][it * T:])
                    for t in range(T):
                        cut = traj.truncated[t, e] and not traj.terminated[t, e]
                        assert ((t, e) in finals) == cut
                        if cut:  # the true last observation of the cut episode
                            assert np.array_equal(finals[(t, e)], [uid, counts[t] + 1])
                    assert np.array_equal(traj.last_obs[e], [uid, (it + 1) * T])
    finally:
        for g in groups:
            g.shutdown()
