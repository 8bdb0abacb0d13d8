"""KL estimators: hand values, exact expectations, penalty and loss forms."""

from __future__ import annotations

import math

import pytest
import torch

from m2flow.algorithms.kl import kl_estimate, kl_loss, kl_penalty

torch.set_num_threads(1)
F64 = torch.float64
LN2 = math.log(2)


def test_hand_values():
    # x = log pi - log pi_ref = +ln 2 and -ln 2
    lp, ref = torch.tensor([[LN2, -LN2]], dtype=F64), torch.zeros(1, 2, dtype=F64)
    torch.testing.assert_close(kl_estimate(lp, ref, "k1"), torch.tensor([[LN2, -LN2]], dtype=F64))
    # k2 = 0.5 * ln(2)^2 = 0.24023 for both signs
    torch.testing.assert_close(kl_estimate(lp, ref, "k2"), torch.full((1, 2), 0.5 * LN2**2, dtype=F64))
    # k3 = exp(-x) - 1 + x: 0.5 - 1 + ln 2 = 0.19315 and 2 - 1 - ln 2 = 0.30685
    torch.testing.assert_close(kl_estimate(lp, ref, "k3"), torch.tensor([[LN2 - 0.5, 1 - LN2]], dtype=F64))
    with pytest.raises(KeyError, match="valid names: k1, k2, k3"):
        kl_estimate(lp, ref, "k4")


@pytest.mark.parametrize("seed", range(5))
def test_k1_and_k3_are_unbiased_k3_nonnegative(seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(6, generator=gen, dtype=F64), 0)  # the policy, which samples
    p = torch.softmax(torch.randn(6, generator=gen, dtype=F64), 0)  # the reference
    true_kl = (q * (q / p).log()).sum()
    lq, lp = q.log().unsqueeze(0), p.log().unsqueeze(0)
    # Exact expectation over the 6 outcomes under q, no sampling noise.
    for kind in ("k1", "k3"):
        torch.testing.assert_close((q * kl_estimate(lq, lp, kind)[0]).sum(), true_kl)
    assert torch.all(kl_estimate(lq, lp, "k3") >= 0)
    assert torch.all(kl_estimate(lq, lp, "k2") >= 0)


def test_loss_and_penalty_respect_the_mask():
    lp = torch.tensor([[LN2, 0.0, float("nan")]], dtype=F64, requires_grad=True)
    ref = torch.zeros(1, 3, dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    out = kl_loss(lp, ref, mask, kind="k3")
    # mean over the two real tokens: (ln 2 - 0.5 + 0) / 2
    assert out.loss.item() == pytest.approx((LN2 - 0.5) / 2)
    out.loss.backward()
    # d k3 / dx = 1 - exp(-x) = 0.5 at x = ln 2, / 2 tokens; padding gets exactly 0
    torch.testing.assert_close(lp.grad, torch.tensor([[0.25, 0.0, 0.0]], dtype=F64))
    penalty = kl_penalty(lp, ref, mask, coef=0.1, kind="k1")
    assert not penalty.requires_grad
    torch.testing.assert_close(penalty, torch.tensor([[0.1 * LN2, 0.0, 0.0]], dtype=F64))


def test_k3_is_finite_for_extreme_log_ratios():
    lp = torch.tensor([[-1000.0, 1000.0]])
    assert torch.isfinite(kl_estimate(lp, torch.zeros(1, 2), "k3")).all()
