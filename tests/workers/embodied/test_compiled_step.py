"""The compiled PPO minibatch step (``actor.compile``) against the eager one."""

from __future__ import annotations

import logging
import threading

import gymnasium as gym
import pytest
import torch
from torch._dynamo.utils import counters

from m2flow.models.policies import PolicyConfig, build_policy
from m2flow.workers.embodied.actor import zero_batch
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.ppo import PPOUpdater
from tests.workers.embodied.test_ppo import BOX_ACT, BOX_OBS, _batch, _ThreadAllReduce

torch.set_num_threads(1)

CASES = {
    # name: (PPO config, policy config, discrete actions)
    "gaussian, entropy bonus": (PPOConfig(ent_coef=0.01, minibatch_size=32), PolicyConfig(hidden_sizes=[16, 16]),
                                False),
    "categorical, shared relu trunk": (PPOConfig(minibatch_size=40),
                                       PolicyConfig(hidden_sizes=[16], shared_critic=True, activation="relu"), True),
    "categorical, entropy bonus": (PPOConfig(ent_coef=0.01, minibatch_size=32), PolicyConfig(hidden_sizes=[16, 16]),
                                   True),
}


def _updaters(name: str, **kwargs) -> tuple[PPOUpdater, PPOUpdater]:
    cfg, policy_cfg, discrete = CASES[name]
    act = gym.spaces.Discrete(4) if discrete else BOX_ACT

    def one(compile: bool) -> PPOUpdater:
        torch.manual_seed(0)
        return PPOUpdater(build_policy(BOX_OBS, act, policy_cfg), cfg, seed=5, compile=compile, **kwargs)

    return one(False), one(True)


def _captured() -> int:
    return counters["stats"]["calls_captured"]


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_updates_train_as_the_eager_ones(name):
    eager, compiled = _updaters(name)
    discrete = CASES[name][2]
    # 96 samples: 3 minibatches of 32, or 40 + 40 + 16 (a short last one, a second compiled shape)
    before = _captured()
    compiled.warm_up(zero_batch(BOX_OBS, gym.spaces.Discrete(4) if discrete else BOX_ACT, 96, torch.device("cpu")))
    assert _captured() > before  # it compiled, in the warm-up
    assert torch.equal(compiled.flat.param, eager.flat.param)  # ... which changed nothing
    assert compiled.optimizer.step_count == 0 and not compiled.optimizer.exp_avg.any()
    warmed = _captured()
    for seed in (2, 3):
        batch = _batch(n=96, discrete=discrete, seed=seed)
        m_eager, m_compiled = eager.update(batch), compiled.update(batch)
        assert torch.allclose(compiled.flat.param, eager.flat.param, atol=1e-5), name
        assert torch.allclose(compiled.optimizer.exp_avg_sq, eager.optimizer.exp_avg_sq, atol=1e-6)
        for key, value in m_eager.items():
            assert m_compiled[key] == pytest.approx(value, abs=1e-5), key
    assert compiled.compiling and compiled.compiled.failure is None
    # 2 updates x 10 epochs x 3 minibatches
    assert compiled.optimizer.step_count == eager.optimizer.step_count == 2 * 10 * 3
    assert _captured() == warmed  # nothing compiled again after the warm-up


def test_compiled_data_parallel_ranks_train_as_one_eager_rank():
    cfg = PPOConfig(epochs=3, minibatch_size=32)
    batch = _batch(n=96)

    def updater(rank: int, world: int, all_reduce=None, compile: bool = False) -> PPOUpdater:
        torch.manual_seed(0)
        policy = build_policy(BOX_OBS, BOX_ACT, PolicyConfig(hidden_sizes=[16, 16]))
        return PPOUpdater(policy, cfg, rank, world, all_reduce, seed=5, compile=compile)

    single = updater(0, 1)
    single.update(batch)
    reducer = _ThreadAllReduce(2)
    ranks = [updater(r, 2, reducer.for_rank(r), compile=True) for r in range(2)]
    for u in ranks:  # compiled here, one at a time, before the threads run
        u.warm_up(zero_batch(BOX_OBS, BOX_ACT, 96, torch.device("cpu")))
        assert u.compiled is not None and not u.compiled.fused  # gradient, all-reduce, then the update
    threads = [threading.Thread(target=u.update, args=(batch,)) for u in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(u.compiling for u in ranks)
    assert torch.equal(ranks[0].flat.param, ranks[1].flat.param)  # ranks never drift apart
    assert torch.allclose(ranks[0].flat.param, single.flat.param, atol=1e-5)


def test_target_kl_stops_compiled_epochs_as_eager_ones():
    cfg = PPOConfig(epochs=10, minibatch_size=32, lr=0.05, target_kl=1e-4)
    results = []
    for compile in (False, True):
        torch.manual_seed(0)
        u = PPOUpdater(build_policy(BOX_OBS, BOX_ACT, PolicyConfig(hidden_sizes=[16, 16])), cfg, compile=compile)
        results.append((u.update(_batch(n=96)), u))
    (m_eager, eager), (m_compiled, compiled) = results
    assert compiled.compiling
    assert m_compiled["actor/early_stop"] == m_eager["actor/early_stop"] == 1.0
    assert m_compiled["actor/updates"] == m_eager["actor/updates"]
    assert compiled.optimizer.step_count == eager.optimizer.step_count  # the stopped step is not taken
    assert torch.allclose(compiled.flat.param, eager.flat.param, atol=1e-5)


def test_a_failing_compile_trains_eagerly(caplog):
    eager, compiled = _updaters("gaussian, entropy bonus")

    def broken(*args):
        raise RuntimeError("no C++ compiler found\nmore detail")

    compiled.compiled._whole = broken
    with caplog.at_level(logging.WARNING):
        metrics = compiled.update(_batch(n=96))
    assert not compiled.compiling
    assert compiled.compiled.failure == "RuntimeError: no C++ compiler found"
    assert "training eagerly" in caplog.text
    # The failure left nothing half done: the run is the eager one exactly.
    assert metrics == eager.update(_batch(n=96))
    assert torch.equal(compiled.flat.param, eager.flat.param)


def test_compile_without_a_closed_form_warns_and_trains_eagerly(caplog):
    with caplog.at_level(logging.WARNING):
        torch.manual_seed(0)
        u = PPOUpdater(build_policy(BOX_OBS, BOX_ACT, PolicyConfig(hidden_sizes=[8])), PPOConfig(value_clip=0.2),
                       compile=True)
    assert u.compiled is None and not u.compiling
    assert "actor.compile" in caplog.text and "training eagerly" in caplog.text
    assert u.update(_batch(n=64))["actor/updates"] == 10
