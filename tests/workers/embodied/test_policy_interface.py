"""The embodied workers on a policy other than the actor-critic (the small VLA), through its act / evaluate only."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from m2flow.algorithms.losses import ppo_policy_loss
from m2flow.models.policies import PolicyConfig, build_policy
from m2flow.models.vla import VLAConfig, VLAPolicy
from m2flow.workers.embodied.closed_form import supports
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.inference import PolicyEngine
from m2flow.workers.embodied.minibatch_forward import MinibatchForward, PolicyForward, minibatch_forward
from m2flow.workers.embodied.ppo import PPOBatch, PPOUpdater
from tests.models.test_vla import packed_obs

torch.set_num_threads(1)

TINY = VLAConfig(height=32, width=32, dim=32, depth=1, heads=2, stem_channels=[8, 16], grid=2, num_bins=16)
OBS = gym.spaces.Box(0, 255, (TINY.layout().size,), np.uint8)
ACT = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


def _vla(seed: int = 0, logprob: str = "token") -> VLAPolicy:
    torch.manual_seed(seed)
    config = PolicyConfig(kind="vla", vla=VLAConfig(**{**vars(TINY), "logprob": logprob}))
    return build_policy(OBS, ACT, config)


def _batch(policy: VLAPolicy, n: int = 24, seed: int = 1) -> PPOBatch:
    obs = packed_obs(TINY, n, seed)
    out = policy.act(obs, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed)
    advantages = torch.randn(n, generator=g)
    return PPOBatch(obs, out.actions, out.logprobs, out.values, advantages, advantages + out.values)


def test_the_fast_paths_are_for_the_actor_critic_only():
    policy = _vla()
    assert isinstance(minibatch_forward(policy), PolicyForward) and not supports(policy, PPOConfig())
    mlp = build_policy(gym.spaces.Box(-1, 1, (3,)), ACT, PolicyConfig())
    assert isinstance(minibatch_forward(mlp), MinibatchForward) and supports(mlp, PPOConfig())


def _twin_engines(config: PolicyConfig, seed: int) -> tuple[PolicyEngine, PolicyEngine]:
    """Two rollout engines with the same weights and action-noise seeds, serving sources 0 and 1."""
    engines = []
    for _ in range(2):
        torch.manual_seed(0)
        engines.append(PolicyEngine(OBS, ACT, config, seed=seed, sources=[0, 1]))
    return engines[0], engines[1]


def test_engine_actions_per_source_repeat_and_survive_a_checkpoint():
    obs = packed_obs(TINY, 6).numpy()
    a, b = _twin_engines(PolicyConfig(kind="vla", vla=TINY), seed=7)
    first = a.act_many([obs[:3], obs[3:]], [0, 1])
    assert b.act(obs[3:], 1).tolist() == first[1].tolist()  # source 1 alone: the same actions
    assert first[0].dtype == np.float32 and first[0].shape == (3, 4)
    state = a.rng_state()
    again = a.act_many([obs[:3], obs[3:]], [0, 1])
    a.load_rng_state(state)
    assert all(np.array_equal(x, y) for x, y in zip(a.act_many([obs[:3], obs[3:]], [0, 1]), again))


@pytest.mark.parametrize("chunk", [1, 3])
def test_engine_hands_over_the_log_probs_of_what_it_sampled(chunk):
    # The behaviour log-probs of bounded staleness, recorded as the rollout acts: the same actions as
    # act_many draws, and per decision the joint log-probability evaluate gives those actions.
    obs = packed_obs(TINY, 5).numpy()
    a, b = _twin_engines(PolicyConfig(kind="vla", vla=VLAConfig(**{**vars(TINY), "chunk": chunk})), seed=3)
    scored = a.act_scored([obs[:2], obs[2:]], [0, 1])
    plain = b.act_many([obs[:2], obs[2:]], [0, 1])
    for (actions, logprobs), expected, o in zip(scored, plain, (obs[:2], obs[2:])):
        assert np.array_equal(actions, expected)
        assert logprobs.dtype == np.float32 and logprobs.shape == (len(o),)
        with torch.no_grad():
            out = a.policy.evaluate(torch.from_numpy(o), torch.from_numpy(actions))
        np.testing.assert_allclose(logprobs, out.logprobs.reshape(len(o), -1).sum(-1).numpy(), atol=1e-5)


def test_the_actor_critic_engine_records_no_log_probs():
    engine = PolicyEngine(gym.spaces.Box(-1, 1, (3,), np.float32), ACT, PolicyConfig(), seed=0, sources=[0])
    [(actions, logprobs)] = engine.act_scored([np.zeros((2, 3), np.float32)], [0])
    assert actions.shape == (2, 4) and logprobs is None


def test_token_level_loss_is_the_registered_ppo_loss_over_action_tokens():
    policy = _vla()
    batch = _batch(policy)
    assert batch.logprobs.shape == (24, 4)
    cfg = PPOConfig(vf_coef=0.5)
    updater = PPOUpdater(policy, cfg)
    with torch.no_grad():  # move the weights a little so the ratios are not all 1
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss, metrics = updater.minibatch_loss(batch.obs, batch.actions, batch.logprobs, batch.advantages,
                                           batch.returns, batch.values)
    out = policy.evaluate(batch.obs, batch.actions)
    tokens = torch.ones_like(out.logprobs)
    reference = ppo_policy_loss(out.logprobs, batch.logprobs, batch.advantages[:, None].expand(-1, 4), tokens,
                                clip_low=cfg.clip, agg="token-mean")
    value = ((out.values - batch.returns) ** 2).mean()  # SB3's value loss: no 1/2
    assert torch.allclose(loss, reference.loss + cfg.vf_coef * value, atol=1e-6)
    ratio = (out.logprobs - batch.logprobs).exp()  # SB3's clip fraction: tokens whose ratio left the range
    assert torch.allclose(metrics["actor/clip_frac"], ((ratio - 1).abs() > cfg.clip).float().mean(), atol=1e-6)
    assert torch.allclose(metrics["actor/approx_kl"], reference.metrics["actor/approx_kl"], atol=1e-6)


def test_action_level_loss_takes_one_ratio_per_action():
    policy = _vla(logprob="action")
    batch = _batch(policy)
    assert batch.logprobs.shape == (24,)
    updater = PPOUpdater(policy, PPOConfig())
    loss, _ = updater.minibatch_loss(batch.obs, batch.actions, batch.logprobs, batch.advantages,
                                     batch.returns, batch.values)
    out = policy.evaluate(batch.obs, batch.actions)
    reference = ppo_policy_loss(out.logprobs[None], batch.logprobs[None], batch.advantages[None],
                                torch.ones(1, 24), agg="token-mean")
    assert torch.allclose(loss, reference.loss + 0.5 * ((out.values - batch.returns) ** 2).mean(), atol=1e-6)


@pytest.mark.learning
def test_an_update_moves_the_vla_and_lowers_its_loss():
    policy = _vla()
    batch = _batch(policy, n=32)
    updater = PPOUpdater(policy, PPOConfig(epochs=4, minibatch_size=8, lr=1e-3))
    before = updater.minibatch_loss(batch.obs, batch.actions, batch.logprobs, batch.advantages, batch.returns,
                                    batch.values)[0].item()
    metrics = updater.update(batch)
    after = updater.minibatch_loss(batch.obs, batch.actions, batch.logprobs, batch.advantages, batch.returns,
                                   batch.values)[0].item()
    assert metrics["actor/updates"] == 16 and metrics["actor/skipped_updates_count"] == 0
    assert after < before


@pytest.mark.learning
def test_a_critic_warmup_update_fits_the_value_and_leaves_the_vla_acting_as_before():
    policy = _vla()
    batch = _batch(policy, n=32)
    updater = PPOUpdater(policy, PPOConfig(epochs=4, minibatch_size=8, lr=1e-2, ent_coef=0.01))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    logits_before = policy(batch.obs)[0]
    error_before = ((policy.value(batch.obs) - batch.returns) ** 2).mean()
    metrics = updater.update(batch, critic_only=True)
    assert metrics["actor/critic_warmup"] == 1.0 and metrics["actor/updates"] == 16
    moved = {k for k, v in policy.state_dict().items() if not torch.equal(v, before[k])}
    assert moved == {"value_head.weight", "value_head.bias"}
    assert torch.equal(policy(batch.obs)[0], logits_before)
    assert ((policy.value(batch.obs) - batch.returns) ** 2).mean() < error_before
    assert updater.update(batch)["actor/critic_warmup"] == 0.0  # a normal update moves the policy again
    assert not torch.equal(policy(batch.obs)[0], logits_before)


def test_the_updates_entropy_is_the_mean_over_its_own_forwards_with_no_pass_of_its_own(monkeypatch):
    # lr 0: the policy stays as it was, so every minibatch forward sees the batch's entropies; the mean over
    # two epochs of three minibatches is the batch's mean entropy, and evaluate ran once per minibatch only.
    policy = _vla()
    batch = _batch(policy)
    expected = float(policy.evaluate(batch.obs, batch.actions).entropy.mean())
    updater = PPOUpdater(policy, PPOConfig(epochs=2, minibatch_size=8, lr=0.0))
    calls = []
    evaluate = policy.evaluate
    monkeypatch.setattr(policy, "evaluate", lambda obs, actions: calls.append(len(obs)) or evaluate(obs, actions))
    metrics = updater.update(batch, lr=0.0)
    assert calls == [8] * 6
    assert metrics["actor/entropy"] == pytest.approx(expected, rel=1e-5)
