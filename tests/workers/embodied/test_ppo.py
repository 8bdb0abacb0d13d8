"""The embodied PPO update: its loss against the algorithms library, and data parallelism."""

from __future__ import annotations

import io
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

from m2flow.algorithms.losses import ppo_policy_loss, value_loss
from m2flow.models.policies import PolicyConfig, build_policy
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.flat import FlatParameters
from m2flow.workers.embodied.ppo import PPOBatch, PPOUpdater, evaluate_actions, whiten_minibatches

torch.set_num_threads(1)

BOX_OBS = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
BOX_ACT = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def _policy(action_space=BOX_ACT, seed=0):
    torch.manual_seed(seed)
    return build_policy(BOX_OBS, action_space, PolicyConfig(hidden_sizes=[16, 16]))


def _batch(n=96, discrete=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    actions = torch.randint(0, 4, (n,), generator=g) if discrete else torch.randn(n, 3, generator=g)
    values = torch.randn(n, generator=g)
    advantages = torch.randn(n, generator=g)
    return PPOBatch(torch.randn(n, 5, generator=g), actions, torch.randn(n, generator=g) * 0.1 - 3.0,
                    values, advantages, advantages + values)


def test_flat_parameters_share_storage_and_collect_gradients():
    policy = _policy()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    flat = FlatParameters(policy)
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k])  # same values, now views into the flat buffer
    loss = sum(p.square().sum() for p in policy.parameters())
    loss.backward()
    expected = torch.cat([2 * p.detach().reshape(-1) for p in flat.params])
    assert torch.allclose(flat.grad, expected)
    with torch.no_grad():
        flat.param.add_(1.0)
    assert torch.allclose(policy.head.log_std, before["head.log_std"] + 1.0)


def test_evaluate_actions_matches_the_policy_interface():
    policy = _policy()
    batch = _batch()
    logp, values = evaluate_actions(policy, batch.obs, batch.actions)
    ref = policy.evaluate(batch.obs, batch.actions)
    assert torch.allclose(logp, ref.logprobs, atol=1e-6)
    assert torch.allclose(values, ref.values)


def test_whiten_minibatches_uses_each_minibatch_alone():
    adv = torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 5.0])
    out = whiten_minibatches(adv, [(0, 3), (3, 6), (6, 7)])
    assert torch.allclose(out[:3], torch.tensor([-1.0, 0.0, 1.0]))  # mean 2, std 1
    assert torch.allclose(out[3:6], torch.tensor([-1.0, 0.0, 1.0]))  # mean 20, std 10
    assert out[6] == 0.0  # a single sample has no spread: (x - mean) / eps = 0


@pytest.mark.parametrize(("value_clip", "discrete"), [(None, False), (0.1, False), (None, True)])
def test_loss_equals_the_algorithms_library(value_clip, discrete):
    cfg = PPOConfig(value_clip=value_clip, vf_coef=0.7)
    policy = _policy(gym.spaces.Discrete(4) if discrete else BOX_ACT)
    updater = PPOUpdater(policy, cfg)
    b = _batch(n=64, discrete=discrete)
    adv = whiten_minibatches(b.advantages, [(0, 64)])
    loss, metrics = updater.minibatch_loss(b.obs, b.actions, b.logprobs, adv, b.returns, b.values)
    logp, values = evaluate_actions(policy, b.obs, b.actions)
    mask = torch.ones(1, 64)
    pg = ppo_policy_loss(logp[None], b.logprobs[None], adv[None], mask, clip_low=cfg.clip)
    # The library's value loss carries a factor 1/2; ours is the plain squared error (as SB3).
    vl = value_loss(values[None], b.values[None], b.returns[None], mask, clip_range=value_clip)
    expected = pg.loss + cfg.vf_coef * 2 * vl.loss
    assert torch.allclose(loss, expected, atol=1e-5)
    assert torch.allclose(metrics["actor/pg_loss"], pg.loss, atol=1e-6)
    assert torch.allclose(metrics["actor/approx_kl"], pg.metrics["actor/approx_kl"], atol=1e-5)
    # clip_frac counts ratios outside [1 - clip, 1 + clip], as Stable-Baselines3 reports it
    ratio = (logp - b.logprobs).exp()
    assert torch.allclose(metrics["actor/clip_frac"], ((ratio - 1).abs() > cfg.clip).float().mean())
    assert torch.allclose(metrics["critic/value_loss"], 2 * vl.metrics["critic/value_loss"], atol=1e-5)


class _ThreadAllReduce:
    """An in-process sum over ``world`` threads, standing in for torch.distributed."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world)
        self.slots: list[torch.Tensor | None] = [None] * world

    def for_rank(self, rank: int):
        def all_reduce(t: torch.Tensor) -> None:
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.slots)  # the same order on every rank
            self.barrier.wait()
            t.copy_(total)

        return all_reduce


@pytest.mark.parametrize("discrete", [False, True])
def test_two_ranks_train_exactly_like_one(discrete):
    cfg = PPOConfig(epochs=3, minibatch_size=32)
    act = gym.spaces.Discrete(4) if discrete else BOX_ACT
    batch = _batch(n=96, discrete=discrete)
    single = PPOUpdater(_policy(act), cfg, seed=5)
    single_metrics = single.update(batch)
    reducer = _ThreadAllReduce(2)
    updaters = [PPOUpdater(_policy(act), cfg, r, 2, reducer.for_rank(r), seed=5) for r in range(2)]
    results: list[dict] = [{}, {}]
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, updaters[r].update(batch)))
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, tensor in single.policy.state_dict().items():
        for u in updaters:
            assert torch.allclose(u.policy.state_dict()[name], tensor, atol=1e-5), name
    assert torch.equal(updaters[0].flat.param, updaters[1].flat.param)  # ranks never drift apart
    for key in ("actor/pg_loss", "critic/value_loss", "actor/approx_kl", "actor/clip_frac"):
        assert results[0][key] == pytest.approx(single_metrics[key], abs=1e-5)
    assert results[0]["actor/updates"] == single_metrics["actor/updates"] == 9  # 3 epochs x 3 minibatches


def test_gradient_clipping_bounds_the_step():
    cfg = PPOConfig(epochs=1, minibatch_size=64, max_grad_norm=1e-3, lr=1.0)
    policy = _policy()
    updater = PPOUpdater(policy, cfg)
    b = _batch(n=64)
    loss, _ = updater.minibatch_loss(b.obs, b.actions, b.logprobs, b.advantages, b.returns, b.values)
    updater.flat.zero_grad()
    loss.backward()
    updater._step()
    assert float(torch.linalg.vector_norm(updater.flat.grad)) == pytest.approx(1e-3, rel=1e-3)


def test_target_kl_stops_the_epochs():
    cfg = PPOConfig(epochs=10, minibatch_size=32, lr=0.05, target_kl=1e-4)
    updater = PPOUpdater(_policy(), cfg)
    metrics = updater.update(_batch(n=96))
    assert metrics["actor/early_stop"] == 1.0
    assert metrics["actor/updates"] < 30


def test_update_lowers_the_loss_on_a_fixed_batch():
    cfg = PPOConfig(epochs=20, minibatch_size=96, lr=1e-2)
    policy = _policy()
    b = _batch(n=96)
    updater = PPOUpdater(policy, cfg)
    adv = whiten_minibatches(b.advantages, [(0, 96)])
    before, _ = updater.minibatch_loss(b.obs, b.actions, b.logprobs, adv, b.returns, b.values)
    updater.update(b)
    after, _ = updater.minibatch_loss(b.obs, b.actions, b.logprobs, adv, b.returns, b.values)
    assert after.item() < before.item()


def test_checkpoint_round_trip_restores_optimizer_and_shuffling():
    cfg = PPOConfig(epochs=2, minibatch_size=32)
    a = PPOUpdater(_policy(), cfg, seed=3)
    a.update(_batch())
    buffer = io.BytesIO()  # through bytes, as a checkpoint file: no tensor is shared with ``a``
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=False)
    weights = {k: v.clone() for k, v in a.policy.state_dict().items()}
    b = PPOUpdater(_policy(seed=9), cfg, seed=4)
    with torch.no_grad():
        for k, v in b.policy.state_dict().items():
            v.copy_(weights[k])
    b.load_state_dict(state)
    ma, mb = a.update(_batch(seed=2)), b.update(_batch(seed=2))
    assert ma == mb
    assert torch.equal(a.flat.param, b.flat.param)


def test_flat_adam_matches_torch_adam():
    from m2flow.workers.embodied.flat import FlatAdam

    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(50))
    ref = torch.nn.Parameter(ours.detach().clone())
    flat = FlatAdam(ours, lr=1e-2, eps=1e-5)
    torch_adam = torch.optim.Adam([ref], lr=1e-2, eps=1e-5)
    for step in range(20):
        grad = torch.randn(50) * (step + 1)
        ours.grad, ref.grad = grad.clone(), grad.clone()
        flat.step()
        torch_adam.step()
        assert torch.allclose(ours, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("case", "cfg_kwargs", "policy_kwargs", "discrete"), [
    ("gaussian", {}, {}, False),
    ("shared trunk", {}, {"shared_critic": True}, False),
    ("relu, entropy bonus", {"ent_coef": 0.01}, {"activation": "relu"}, False),
    ("categorical", {}, {}, True),
    ("no critic", {"use_critic": False}, {}, False),
])
def test_closed_form_gradient_equals_autograd(case, cfg_kwargs, policy_kwargs, discrete):
    from m2flow.workers.embodied.closed_form import ClosedFormPPO

    cfg = PPOConfig(clip=0.1, vf_coef=0.7, **cfg_kwargs)
    act = gym.spaces.Discrete(4) if discrete else BOX_ACT
    torch.manual_seed(0)
    policy = build_policy(BOX_OBS, act, PolicyConfig(hidden_sizes=[16, 8], **policy_kwargs))
    auto = PPOUpdater(policy, cfg, closed_form=False)
    b = _batch(n=40, discrete=discrete)
    actions, offset = auto.policy_forward.prepare_actions(b.actions), auto.policy_forward.offset(b.logprobs)
    neg_adv = -b.advantages / 40
    loss, parts = auto._step_loss(b.obs, actions, offset, neg_adv, b.returns, b.values, 1 / 40)
    auto.flat.zero_grad()
    loss.backward()
    expected = auto.flat.grad.clone()
    auto.flat.grad.fill_(123.0)  # the closed form must overwrite every gradient
    closed_parts = ClosedFormPPO(policy, cfg).step(b.obs, actions, offset, neg_adv, b.returns, 1 / 40)
    assert torch.allclose(auto.flat.grad, expected, atol=1e-6), case
    assert torch.allclose(closed_parts, parts.detach(), atol=1e-5), case


def test_closed_form_is_used_only_where_it_applies():
    from m2flow.workers.embodied.closed_form import supports

    policy = _policy()
    assert supports(policy, PPOConfig())
    assert not supports(policy, PPOConfig(value_clip=0.2))
    categorical = _policy(gym.spaces.Discrete(4))
    assert supports(categorical, PPOConfig(ent_coef=0.01))
    gelu = build_policy(BOX_OBS, BOX_ACT, PolicyConfig(hidden_sizes=[8], activation="gelu"))
    assert not supports(gelu, PPOConfig())


def test_pixel_observations_train_through_autograd():
    from m2flow.workers.embodied.inference import PolicyEngine

    pixels = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)
    cfg = PolicyConfig(hidden_sizes=[8], cnn_channels=[4], cnn_kernels=[3], cnn_strides=[2], cnn_features=16)
    torch.manual_seed(0)
    policy = build_policy(pixels, BOX_ACT, cfg)
    updater = PPOUpdater(policy, PPOConfig(epochs=5, minibatch_size=32, lr=1e-2))
    assert updater.closed_form is None  # a CNN encoder: autograd
    g = torch.Generator().manual_seed(0)
    n = 32
    obs = torch.randint(0, 256, (n, 12, 12, 3), generator=g, dtype=torch.uint8)
    adv = torch.randn(n, generator=g)
    batch = PPOBatch(obs, torch.randn(n, 3, generator=g), torch.full((n,), -3.0), torch.zeros(n), adv, adv)
    before, _ = updater.minibatch_loss(obs, batch.actions, batch.logprobs, adv, batch.returns, batch.values)
    updater.update(batch)
    after, _ = updater.minibatch_loss(obs, batch.actions, batch.logprobs, adv, batch.returns, batch.values)
    assert after.item() < before.item()
    engine = PolicyEngine(pixels, BOX_ACT, cfg, 0, [0])
    assert not engine._use_numpy
    actions = engine.act(obs[:3].numpy(), 0)
    assert actions.shape == (3, 3) and actions.dtype == np.float32


@pytest.mark.gpu
def test_update_on_cuda_survives_offload_and_onload():
    policy = _policy().cuda()
    updater = PPOUpdater(policy, PPOConfig(epochs=2, minibatch_size=32))
    b = _batch()
    cuda_batch = PPOBatch(*(getattr(b, f).cuda() for f in ("obs", "actions", "logprobs", "values",
                                                            "advantages", "returns")))
    updater.update(cuda_batch)
    updater.to("cpu")
    assert policy.head.log_std.device.type == "cpu" and updater.flat.param.device.type == "cpu"
    updater.to("cuda")
    assert policy.head.log_std.device.type == "cuda"
    metrics = updater.update(cuda_batch)
    assert metrics["actor/updates"] == 6


def test_a_minibatch_of_equal_advantages_whitens_to_exact_zeros():
    spread = torch.arange(1.0, 8.0)
    adv = torch.cat([torch.full((7,), 0.1), spread, torch.full((6,), 0.3)])
    # float32 rounding puts the mean a step off the values; (a - mean) / (std + eps) gave -0.41.
    assert adv[:7].mean() != adv[0]
    assert ((adv[:7] - adv[:7].mean()) / (adv[:7].std() + 1e-8)).abs().min() > 0.4
    out = whiten_minibatches(adv, [(0, 7), (7, 14), (14, 20)])
    assert torch.equal(out[:7], torch.zeros(7)) and torch.equal(out[14:], torch.zeros(6))
    torch.testing.assert_close(out[7:14], (spread - 4.0) / spread.std())


@pytest.mark.parametrize("closed_form", [True, False])
def test_a_nan_in_the_loss_undoes_the_update_and_too_many_in_a_row_stop_the_run(closed_form):
    from m2flow.runtime.errors import RunHealthError

    cfg = PPOConfig(epochs=2, minibatch_size=32)
    updater = PPOUpdater(_policy(), cfg, closed_form=closed_form, max_skipped_updates=2)
    before = [p.detach().clone() for p in updater.policy.parameters()]
    poisoned = _batch(n=96)
    poisoned.returns[70] = float("nan")  # one sample of the third minibatch: the value loss turns NaN
    m = updater.update(poisoned)
    assert m["actor/skipped_updates_count"] == 1.0 and updater.skipped_in_row == 1
    assert all(torch.equal(a, b) for a, b in zip(before, updater.policy.parameters()))
    assert updater.optimizer.step_count == 0 and not updater.optimizer.exp_avg.any()
    m = updater.update(_batch(n=96))  # a finite update goes through and resets the count
    assert m["actor/skipped_updates_count"] == 0.0 and updater.skipped_in_row == 0
    assert updater.optimizer.step_count == 6
    updater.update(poisoned)
    with pytest.raises(RunHealthError, match=r"2 PPO updates in a row skipped .*actor.max_skipped_updates=2"):
        updater.update(poisoned)


@pytest.mark.learning
@pytest.mark.parametrize("separate_critic", [False, True])
def test_a_critic_warmup_update_trains_only_what_the_value_alone_depends_on(separate_critic):
    torch.manual_seed(0)
    policy = build_policy(BOX_OBS, BOX_ACT, PolicyConfig(hidden_sizes=[16, 16], shared_critic=not separate_critic))
    updater = PPOUpdater(policy, PPOConfig(epochs=3, minibatch_size=32, lr=1e-2, ent_coef=0.01))
    assert updater.closed_form is not None  # the mask applies to the closed-form gradient too
    own = {id(p) for p in policy.critic_parameters()}
    assert (policy.critic_trunk is not None) == separate_critic
    before = [p.detach().clone() for p in policy.parameters()]
    batch = _batch()
    error_before = ((policy.value(batch.obs) - batch.returns) ** 2).mean()
    updater.update(batch, critic_only=True)
    for p, old in zip(policy.parameters(), before):
        assert torch.equal(p, old) != (id(p) in own)  # the critic's own parameters moved, nothing else did
    assert ((policy.value(batch.obs) - batch.returns) ** 2).mean() < error_before


def test_critic_warmup_needs_a_critic_and_a_policy_that_names_its_own_parameters():
    with pytest.raises(ValueError, match="use_critic"):
        PPOConfig(critic_warmup=2, use_critic=False).validate()
    with pytest.raises(ValueError, match="critic_warmup must be >= 0"):
        PPOConfig(critic_warmup=-1).validate()
    with pytest.raises(ValueError, match="critic_warmup_lr"):
        PPOConfig(critic_warmup=1, critic_warmup_lr=0.0).validate()

    class Bare(torch.nn.Module):  # a policy that does not say which parameters are the critic's
        def __init__(self):
            super().__init__()
            self.inner = _policy()

        def evaluate(self, obs, actions):
            return self.inner.evaluate(obs, actions)

    updater = PPOUpdater(Bare(), PPOConfig())
    with pytest.raises(ValueError, match="critic_parameters"):
        updater.update(_batch(), critic_only=True)
