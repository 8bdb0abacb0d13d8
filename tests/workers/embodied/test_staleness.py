"""The actor under bounded staleness: samples past the bound are never trained on, stale ones are
weighted by pi_prox / pi_behav, fresh ones train exactly as in synchronous PPO."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch
from gymnasium import spaces

from m2flow.models.policies import PolicyConfig
from m2flow.workers.embodied.actor import ActorWorker
from m2flow.workers.embodied.settings import EmbodiedActorSettings
from m2flow.workers.embodied.batch import build_batch
from m2flow.workers.embodied.config import ActorConfig, PPOConfig
from m2flow.workers.embodied.messages import Trajectory
from tests.workers.harness import local_worker

OBS, ACT = spaces.Box(-1.0, 1.0, (4,), np.float32), spaces.Discrete(3)
T, N = 8, 4


class FakeComm:
    """Hands the actor the queued trajectory of each env rank, in order."""

    def __init__(self) -> None:
        self.queues: dict[int, deque] = {}

    def put(self, traj: Trajectory) -> None:
        self.queues.setdefault(traj.env_rank, deque()).append(traj)

    def recv(self, group: str, rank: int) -> Trajectory:
        return self.queues[rank].popleft()


def _traj(env_rank: int, iteration: int, version: int, seed: int) -> Trajectory:
    rng = np.random.default_rng(seed)
    return Trajectory(
        env_rank=env_rank, iteration=iteration,
        obs=rng.uniform(-1, 1, (T, N, 4)).astype(np.float32), actions=rng.integers(0, 3, (T, N)),
        rewards=rng.normal(size=(T, N)).astype(np.float32), terminated=np.zeros((T, N), bool),
        truncated=np.zeros((T, N), bool), final_index=np.zeros((0, 2), np.int64),
        final_obs=np.zeros((0, 4), np.float32), last_obs=rng.uniform(-1, 1, (N, 4)).astype(np.float32),
        policy_version=version)


def _actor(max_staleness: int, env_ranks: int) -> ActorWorker:
    settings = EmbodiedActorSettings(obs_space=OBS, action_space=ACT, policy=PolicyConfig(hidden_sizes=[8]),
                                     ppo=PPOConfig(epochs=2, minibatch_size=16), actor=ActorConfig(), env_group="env",
                                     env_ranks=env_ranks, total_iterations=10, max_staleness=max_staleness)
    actor = local_worker(ActorWorker, settings=settings)
    actor._m2flow_comm = FakeComm()
    return actor


def _train(actor: ActorWorker, iteration: int, *trajs: Trajectory) -> dict[str, float]:
    for t in trajs:
        actor.comm.put(t)
    return actor.train(iteration)


def _advance(actor: ActorWorker, versions: range) -> None:
    """Train iterations 0 .. with fresh data, sending (and so keeping) the weights of every version."""
    for it in versions:
        actor.send_weights([], it)
        _train(actor, it, *[_traj(e, it, it, 100 * it + e) for e in range(actor.env_ranks)])


def test_a_sample_older_than_the_bound_is_never_trained_on():
    # Two actors alike; at iteration 3 both get the same trajectory within the bound and each a
    # different one past it. Equal weights after the update: the old samples changed nothing.
    a, b = _actor(1, env_ranks=2), _actor(1, env_ranks=2)
    _advance(a, range(3))
    _advance(b, range(3))
    a.send_weights([], 3)
    b.send_weights([], 3)
    ma = _train(a, 3, _traj(0, 3, 2, 7), _traj(1, 3, 1, 8))  # ages 1 (kept) and 2 (past the bound)
    mb = _train(b, 3, _traj(0, 3, 2, 7), _traj(1, 3, 0, 9))  # ages 1 and 3, other samples
    for m in (ma, mb):
        assert m["async/dropped_samples"] == T * N and m["async/age_1_samples"] == T * N
        assert m["actor/batch_size"] == T * N and m["async/staleness_max"] == 1.0
    wa, wb = a.state_dict(), b.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert ma["actor/pg_loss"] == mb["actor/pg_loss"]


def test_when_every_sample_is_too_old_nothing_is_trained():
    actor = _actor(1, env_ranks=1)
    _advance(actor, range(3))
    before = actor.state_dict()
    metrics = _train(actor, 3, _traj(0, 3, 0, 1))  # age 3
    assert metrics["actor/updates"] == 0.0 and metrics["async/dropped_samples"] == T * N
    after = actor.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_weights_of_a_version_never_sent_fail_loudly():
    actor = _actor(2, env_ranks=1)
    _advance(actor, range(2))
    del actor._sent[1]  # as if the weights a trajectory names had never left this actor
    with pytest.raises(RuntimeError, match="never sent"):
        _train(actor, 2, _traj(0, 2, 1, 1))


def test_stale_samples_carry_the_decoupled_weights_and_fresh_ones_none():
    actor = _actor(1, env_ranks=2)
    _advance(actor, range(2))  # versions 0, 1 sent; the policy is now at version 2
    fresh, stale = _traj(0, 2, 2, 3), _traj(1, 2, 1, 4)
    behaviour = actor._behaviour_policies([fresh, stale], 2)
    assert behaviour[0] is None and behaviour[1] is not None and behaviour[1] is not actor.policy
    batch, metrics = build_batch(actor.policy, [fresh, stale], actor.cfg, "cpu", behaviour)
    from m2flow.workers.embodied.ppo import evaluate_actions

    w = batch.weights.view(T, 2 * N)
    assert torch.equal(w[:, :N], torch.ones(T, N))  # exactly 1: the weights that acted are the current ones
    obs = torch.from_numpy(stale.obs).reshape(-1, 4)
    act = torch.from_numpy(stale.actions).reshape(-1)
    with torch.no_grad():
        prox, _ = evaluate_actions(actor.policy, obs, act)
        behav, _ = evaluate_actions(behaviour[1], obs, act)
    torch.testing.assert_close(w[:, N:].reshape(-1), torch.exp(prox - behav))
    assert not torch.allclose(w[:, N:], torch.ones(T, N))  # two updates apart: the policies differ
    sync_batch, _ = build_batch(actor.policy, [fresh, stale], actor.cfg, "cpu")
    assert sync_batch.weights is None
    assert torch.equal(sync_batch.logprobs, batch.logprobs) and torch.equal(sync_batch.advantages, batch.advantages)


def test_behaviour_log_probs_recorded_by_the_rollout_replace_the_scoring_of_the_old_weights():
    # A stale trajectory that carries the log-probs the rollout sampled with: the decoupled weights are
    # pi_prox / exp(recorded), and the actor needs no copy of the weights that acted.
    actor = _actor(1, env_ranks=2)
    _advance(actor, range(2))
    fresh, stale = _traj(0, 2, 2, 3), _traj(1, 2, 1, 4)
    scoring = actor._behaviour_policies([fresh, stale], 2)
    obs = torch.from_numpy(stale.obs).reshape(-1, 4)
    act = torch.from_numpy(stale.actions).reshape(-1)
    from m2flow.workers.embodied.ppo import evaluate_actions

    with torch.no_grad():
        behav, _ = evaluate_actions(scoring[1], obs, act)
        prox, _ = evaluate_actions(actor.policy, obs, act)
    stale.behaviour_logprobs = behav.view(T, N).numpy() - 0.25  # as if sampled where each action was less likely
    del actor._sent[1]  # nothing left to score with
    behaviour = actor._behaviour_policies([fresh, stale], 2)
    assert behaviour[0] is None and behaviour[1] is stale.behaviour_logprobs
    batch, metrics = build_batch(actor.policy, [fresh, stale], actor.cfg, "cpu", behaviour)
    w = batch.weights.view(T, 2 * N)
    assert torch.equal(w[:, :N], torch.ones(T, N))
    torch.testing.assert_close(w[:, N:].reshape(-1), torch.exp(prox - behav + 0.25))
    assert metrics["async/importance_weight_max"] == pytest.approx(float(w.max()))


def test_recorded_log_probs_of_the_current_weights_leave_a_fresh_batch_unweighted():
    actor = _actor(1, env_ranks=1)
    _advance(actor, range(1))
    fresh = _traj(0, 1, 1, 5)
    fresh.behaviour_logprobs = np.zeros((T, N), np.float32)
    assert actor._behaviour_policies([fresh], 1) is None
