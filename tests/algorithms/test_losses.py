"""Policy, value and entropy losses: hand-worked values, gradients, masking and clip bounds."""

from __future__ import annotations

import math

import pytest
import torch

from m2flow.algorithms.losses import (
    decoupled_ppo_policy_loss,
    entropy_bonus,
    entropy_from_logits,
    policy_loss,
    ppo_policy_loss,
    vanilla_policy_loss,
    value_loss,
)
from tests.algorithms import loop_reference as ref

torch.set_num_threads(1)
F64 = torch.float64

# Five tokens and one padding slot holding garbage.
#   A     ratio   unclipped -A*r   clipped -A*clip(r, 0.8, 1.28)   max (PPO)   dual clip c=3
#  +1     1.5        -1.5              -1.28                        -1.28       -1.28
#  +1     0.5        -0.5              -0.8                         -0.5        -0.5
#  -1     0.5         0.5               0.8                          0.8         0.8
#  -1     5.0         5.0               1.28                         5.0         3.0 (capped at -A*c)
#  +2     1.0        -2.0              -2.0                         -2.0        -2.0
ADV = [1.0, 1.0, -1.0, -1.0, 2.0, float("nan")]
RATIO = [1.5, 0.5, 0.5, 5.0, 1.0, 1.0]
MASK = [1, 1, 1, 1, 1, 0]


def ppo_inputs():
    log_probs = torch.tensor([[math.log(r) for r in RATIO]], dtype=F64)
    log_probs[0, 5] = float("-inf")  # padding may hold anything
    log_probs.requires_grad_(True)
    return log_probs, torch.zeros(1, 6, dtype=F64), torch.tensor([ADV], dtype=F64), torch.tensor([MASK], dtype=F64)


def test_ppo_clip_higher_by_hand():
    log_probs, old, adv, mask = ppo_inputs()
    out = ppo_policy_loss(log_probs, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # token mean: (-1.28 - 0.5 + 0.8 + 5.0 - 2.0) / 5 = 2.02 / 5
    assert out.loss.item() == pytest.approx(0.404)
    # clipped tokens: 1 and 3 (clipped term larger than unclipped) -> 2/5
    assert out.metrics["actor/clip_frac"].item() == pytest.approx(0.4)
    out.loss.backward()
    # d loss / d log pi = -A * ratio / 5 where unclipped is active, 0 where clipped; 0 on padding
    expected = [0.0, -0.5 / 5, 0.0, 5.0 / 5, -2.0 / 5, 0.0]
    torch.testing.assert_close(log_probs.grad, torch.tensor([expected], dtype=F64))


def test_ppo_symmetric_and_dual_clip_by_hand():
    log_probs, old, adv, mask = ppo_inputs()
    # symmetric 0.2: token 1 becomes -1.2 -> (-1.2 - 0.5 + 0.8 + 5 - 2) / 5 = 0.42
    assert ppo_policy_loss(log_probs, old, adv, mask).loss.item() == pytest.approx(0.42)
    out = ppo_policy_loss(log_probs, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    # dual clip caps token 4 at 3.0: (-1.28 - 0.5 + 0.8 + 3.0 - 2.0) / 5 = 0.004
    assert out.loss.item() == pytest.approx(0.004)
    assert out.metrics["actor/dual_clip_frac"].item() == pytest.approx(0.2)
    out.loss.backward()
    assert log_probs.grad[0, 3] == 0  # the capped token gives no gradient
    with pytest.raises(ValueError, match="clip_c must be > 1"):
        ppo_policy_loss(log_probs, old, adv, mask, clip_c=0.9)


def test_ppo_metrics_approx_kl():
    log_probs, old, adv, mask = ppo_inputs()
    out = ppo_policy_loss(log_probs, old, adv, mask)
    # k3 of KL(old || new) per token: r - 1 - log r
    expected = sum(r - 1 - math.log(r) for r in RATIO[:5]) / 5
    assert out.metrics["actor/approx_kl"].item() == pytest.approx(expected)
    assert out.metrics["actor/ratio_mean"].item() == pytest.approx(sum(RATIO[:5]) / 5)


def test_vanilla_policy_gradient_by_hand():
    log_probs = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, -0.5, 2.0]], dtype=F64)
    # -A * log pi = [1, -1, 1], mean 1/3
    out = vanilla_policy_loss(log_probs, log_probs.detach(), adv, torch.ones(1, 3))
    assert out.loss.item() == pytest.approx(1 / 3)
    out.loss.backward()
    torch.testing.assert_close(log_probs.grad, -adv / 3)
    assert out.metrics["actor/approx_kl"].item() == 0.0
    by_name = policy_loss("vanilla", log_probs, log_probs.detach(), adv, torch.ones(1, 3))
    assert by_name.loss.item() == pytest.approx(1 / 3)


def test_value_loss_by_hand():
    values = torch.tensor([[1.0, 2.5, 9.0]], dtype=F64)
    old = torch.tensor([[0.5, 2.0, 0.0]], dtype=F64)
    returns = torch.tensor([[0.0, 3.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    # unclipped errors: (1 - 0)^2 = 1, (2.5 - 3)^2 = 0.25 -> 0.5 * mean = 0.3125
    assert value_loss(values, old, returns, mask).loss.item() == pytest.approx(0.3125)
    # clipped values: 0.5 + 0.2 = 0.7 -> 0.49 (< 1, keep 1); 2.0 + 0.2 = 2.2 -> 0.64 (> 0.25, take it)
    out = value_loss(values, old, returns, mask, clip_range=0.2)
    assert out.loss.item() == pytest.approx(0.5 * (1 + 0.64) / 2)
    assert out.metrics["critic/clip_frac"].item() == pytest.approx(0.5)


def test_entropy_by_hand():
    logits = torch.zeros(1, 2, 4)  # uniform over 4 -> ln 4
    logits[0, 1] = torch.tensor([0.0, 0.0, -1e9, -1e9])  # uniform over 2 -> ln 2
    entropy = entropy_from_logits(logits)
    torch.testing.assert_close(entropy, torch.tensor([[math.log(4), math.log(2)]]))
    out = entropy_bonus(entropy, torch.tensor([[1, 0]]), coef=0.01)
    assert out.loss.item() == pytest.approx(-0.01 * math.log(4))
    assert out.metrics["actor/entropy"].item() == pytest.approx(math.log(4))


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_ppo_matches_loop_reference(seed: int, agg: str):
    gen = torch.Generator().manual_seed(seed)
    batch, length = 4, 6
    log_probs = torch.randn(batch, length, generator=gen, dtype=F64) * 0.5
    old = log_probs + torch.randn(batch, length, generator=gen, dtype=F64) * 0.4
    adv = torch.randn(batch, length, generator=gen, dtype=F64)
    mask = (torch.rand(batch, length, generator=gen) < 0.7).to(F64)
    out = ppo_policy_loss(log_probs, old, adv, mask, clip_low=0.2, clip_high=0.3, clip_c=3.0, agg=agg)
    per_token = [
        [ref.ppo_token_loss(log_probs[b, t].item(), old[b, t].item(), adv[b, t].item(), 0.2, 0.3, 3.0)
         for t in range(length)]
        for b in range(batch)
    ]
    assert out.loss.item() == pytest.approx(ref.aggregate(per_token, mask.tolist(), agg), abs=1e-10)


@pytest.mark.parametrize("seed", range(5))
def test_masked_tokens_never_change_losses_or_gradients(seed: int):
    gen = torch.Generator().manual_seed(seed)
    shape = (3, 5)
    mask = torch.rand(shape, generator=gen) < 0.6
    mask[0, 0] = True
    base = [torch.randn(shape, generator=gen, dtype=F64) for _ in range(4)]
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30], dtype=F64)
    noise = junk[torch.randint(0, 4, shape, generator=gen)]
    dirty = [torch.where(mask, x, noise) for x in base]

    def run(tensors):
        lp = tensors[0].clone().requires_grad_(True)
        v = tensors[1].clone().requires_grad_(True)
        ent = tensors[3].clone().requires_grad_(True)
        losses = [
            ppo_policy_loss(lp, tensors[1], tensors[2], mask, clip_c=3.0).loss,
            vanilla_policy_loss(lp, tensors[1], tensors[2], mask).loss,
            value_loss(v, tensors[2], tensors[3], mask, clip_range=0.2).loss,
            entropy_bonus(ent, mask, coef=0.1).loss,
        ]
        total = sum(losses)
        total.backward()
        return [x.detach() for x in losses], lp.grad, v.grad, ent.grad

    clean_losses, *clean_grads = run(base)
    dirty_losses, *dirty_grads = run(dirty)
    for a, b in zip(clean_losses, dirty_losses):
        assert torch.isfinite(b) and a.item() == b.item()
    for a, b in zip(clean_grads, dirty_grads):
        assert torch.equal(a, b)
        assert torch.all(b[~mask] == 0)


@pytest.mark.parametrize("seed", range(5))
def test_clip_bounds_hold(seed: int):
    gen = torch.Generator().manual_seed(seed)
    log_probs = (torch.randn(8, 16, generator=gen, dtype=F64) * 2).requires_grad_(True)
    old = torch.randn(8, 16, generator=gen, dtype=F64)
    adv = torch.randn(8, 16, generator=gen, dtype=F64)
    mask = torch.ones(8, 16)
    lo, hi, c = 0.2, 0.28, 3.0
    loss = ppo_policy_loss(log_probs, old, adv, mask, clip_low=lo, clip_high=hi, clip_c=c, agg="seq-mean-token-sum")
    loss.loss.backward()
    ratio = (log_probs - old).exp().detach()
    pos, neg = adv > 0, adv < 0
    # The objective gains nothing from pushing the ratio past 1 + clip_high (A > 0) or below
    # 1 - clip_low (A < 0): those tokens have zero gradient. Dual clip zeroes A < 0, ratio > c.
    assert torch.all(log_probs.grad[pos & (ratio > 1 + hi)] == 0)
    assert torch.all(log_probs.grad[neg & (ratio < 1 - lo)] == 0)
    assert torch.all(log_probs.grad[neg & (ratio > c)] == 0)
    assert torch.all(log_probs.grad[pos & (ratio < 1 + hi)] != 0)
    # Per-token loss bounds: >= -A (1 + clip_high) for A > 0, and in [|A|(1 - clip_low), |A| c] for A < 0.
    for b in range(8):
        for t in range(16):
            a, r = adv[b, t].item(), ratio[b, t].item()
            loss = ref.ppo_token_loss(math.log(r), 0.0, a, lo, hi, c)
            if a > 0:
                assert loss >= -a * (1 + hi) - 1e-12
            elif a < 0:
                assert -a * (1 - lo) - 1e-12 <= loss <= -a * c + 1e-12


def test_decoupled_ppo_by_hand():
    # One response of three tokens, sampled by three policies; the learner's proximal log-probs differ.
    lp = torch.tensor([[math.log(0.6), math.log(0.3), math.log(0.5)]], dtype=F64, requires_grad=True)
    prox = torch.tensor([[math.log(0.4), math.log(0.3), math.log(0.5)]], dtype=F64)
    behav = torch.tensor([[math.log(0.2), math.log(0.6), math.log(0.5)]], dtype=F64)
    adv = torch.tensor([[1.0, -2.0, 3.0]], dtype=F64)
    mask = torch.ones(1, 3)
    out = decoupled_ppo_policy_loss(lp, prox, adv, mask, behaviour_log_probs=behav, clip_low=0.2)
    # token 0: r = 0.6/0.4 = 1.5 -> clipped to 1.2 (A > 0 takes the min), w = 0.4/0.2 = 2: 2 * 1.2 * 1 = 2.4
    # token 1: r = 1, w = 0.3/0.6 = 0.5: 0.5 * 1 * -2 = -1
    # token 2: r = 1, w = 1 (a fresh token): 3
    assert out.loss.item() == pytest.approx(-(2.4 - 1.0 + 3.0) / 3)
    assert out.metrics["async/importance_weight_mean"].item() == pytest.approx((2 + 0.5 + 1) / 3)
    assert out.metrics["actor/clip_frac"].item() == pytest.approx(1 / 3)
    out.loss.backward()
    # d/dlp of -(w r A)/3 = -(w r A)/3 where unclipped, 0 where clipped
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -(0.5 * 1 * -2.0) / 3, -3.0 / 3]], dtype=F64))
    capped = decoupled_ppo_policy_loss(lp, prox, adv, mask, behaviour_log_probs=behav, behaviour_weight_cap=1.5)
    assert capped.loss.item() == pytest.approx(-(1.5 * 1.2 - 1.0 + 3.0) / 3)
    # Behaviour = proximal (or none given): exactly ppo.
    plain = ppo_policy_loss(lp, prox, adv, mask)
    assert decoupled_ppo_policy_loss(lp, prox, adv, mask, behaviour_log_probs=prox).loss.item() == plain.loss.item()
    assert decoupled_ppo_policy_loss(lp, prox, adv, mask).loss.item() == plain.loss.item()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_decoupled_ppo_matches_loop_reference_and_puts_no_gradient_through_the_weights(seed: int, agg: str):
    gen = torch.Generator().manual_seed(seed)
    batch, length = 4, 7
    prox = torch.randn(batch, length, generator=gen, dtype=F64) * 0.5 - 1.0
    behav = (prox + torch.randn(batch, length, generator=gen, dtype=F64) * 0.5).requires_grad_()
    lp = (prox + torch.randn(batch, length, generator=gen, dtype=F64) * 0.3).requires_grad_()
    prox.requires_grad_()
    adv = torch.randn(batch, length, generator=gen, dtype=F64)
    mask = (torch.rand(batch, length, generator=gen) < 0.75).to(F64)
    cap = 2.0 if seed % 2 else None
    out = decoupled_ppo_policy_loss(lp, prox, adv, mask, behaviour_log_probs=behav, behaviour_weight_cap=cap,
                                    clip_low=0.2, clip_high=0.28, clip_c=3.0, agg=agg)
    per_token = [[ref.decoupled_ppo_token_loss(lp[b, t].item(), prox[b, t].item(), behav[b, t].item(),
                                               adv[b, t].item(), 0.2, 0.28, cap, 3.0) for t in range(length)]
                 for b in range(batch)]
    assert out.loss.item() == pytest.approx(ref.aggregate(per_token, mask.tolist(), agg), abs=1e-10)
    out.loss.backward()
    assert behav.grad is None or not behav.grad.any()  # the weight is a constant
    assert prox.grad is None or not prox.grad.any()  # the proximal policy is a constant too
    assert lp.grad is not None and lp.grad.any()
