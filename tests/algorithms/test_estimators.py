"""The registered estimators: one call shape, both layouts, clear errors for missing inputs."""

from __future__ import annotations

import pytest
import torch

from m2flow.algorithms import ADV_ESTIMATORS, StepBatch, TokenBatch, compute_advantages
from m2flow.algorithms.advantages import compute_gae, grpo_outcome_advantage
from m2flow.algorithms.masked import masked_whiten

torch.set_num_threads(1)


def token_batch() -> TokenBatch:
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float64)
    return TokenBatch(
        response_mask=mask,
        scores=torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64),
        group_index=torch.tensor([0, 0, 1, 1]),
        values=torch.randn(4, 4, generator=gen, dtype=torch.float64),
        kl=torch.rand(4, 4, generator=gen, dtype=torch.float64),
    )


def test_every_token_estimator_runs_with_one_call_shape():
    batch = token_batch()
    for name in ADV_ESTIMATORS.names():
        out = compute_advantages(name, batch)
        assert out.advantages.shape == batch.response_mask.shape, name
        assert out.returns.shape == batch.response_mask.shape, name
        assert torch.all(out.advantages[~batch.response_mask.bool()] == 0), name
        assert torch.equal(out.mask, batch.response_mask.bool()), name


def test_grpo_broadcasts_per_sequence_advantage_to_tokens():
    batch = token_batch()
    out = compute_advantages("grpo", batch)
    per_seq = grpo_outcome_advantage(batch.scores, group_index=batch.group_index)
    expected = per_seq.unsqueeze(1) * batch.response_mask
    torch.testing.assert_close(out.advantages, expected)
    # group 1 is (1.0, 1.0): constant, all zero
    assert torch.all(out.advantages[2:] == 0)


def test_token_gae_puts_score_on_last_token_and_whitens():
    batch = token_batch()
    raw = compute_advantages("gae", batch, whiten=False)
    # with gamma = lam = 1 the advantage is score - V_t, the same for every token of a sequence
    expected = (batch.scores.unsqueeze(1) - batch.values) * batch.response_mask
    torch.testing.assert_close(raw.advantages, expected)
    torch.testing.assert_close(raw.returns, batch.scores.unsqueeze(1) * batch.response_mask)
    whitened = compute_advantages("gae", batch)
    torch.testing.assert_close(whitened.advantages, masked_whiten(raw.advantages, batch.response_mask))
    # KL in reward: 0.5 * kl subtracted from each token reward
    with_kl = compute_advantages("gae", batch, whiten=False, kl_coef=0.5)
    assert not torch.allclose(with_kl.advantages, raw.advantages)


def test_step_batch_gae_and_grpo():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(5, 4, generator=gen)
    dones = torch.zeros(5, 4)
    dones[2, 1] = 1
    values, next_values = torch.randn(5, 4, generator=gen), torch.randn(4, generator=gen)
    batch = StepBatch(rewards, dones, values=values, next_values=next_values, group_index=torch.tensor([0, 0, 1, 1]))
    out = compute_advantages("gae", batch, gamma=0.9, lam=0.8)
    adv, ret = compute_gae(rewards, values, dones, next_values, gamma=0.9, lam=0.8)
    torch.testing.assert_close(out.advantages, adv)
    torch.testing.assert_close(out.returns, ret)
    assert out.mask.all()
    grpo = compute_advantages("grpo", batch)
    assert grpo.advantages.shape == (5, 4)
    assert not grpo.mask[3:, 1].any()  # env 1 finished at step 2


def test_missing_fields_and_wrong_layout_fail_clearly():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"'grpo' needs TokenBatch.scores"):
        compute_advantages("grpo", TokenBatch(mask), group_size=2)
    with pytest.raises(ValueError, match=r"'gae' needs TokenBatch.values"):
        compute_advantages("gae", TokenBatch(mask, scores=torch.ones(2)))
    with pytest.raises(ValueError, match=r"needs TokenBatch.kl"):
        compute_advantages("reinforce_pp", TokenBatch(mask, scores=torch.ones(2)), kl_coef=0.1)
    with pytest.raises(TypeError, match="takes a TokenBatch"):
        compute_advantages("rloo", StepBatch(torch.zeros(2, 2), torch.zeros(2, 2)))
    with pytest.raises(ValueError, match="StepBatch.values, next_values"):
        compute_advantages("gae", StepBatch(torch.zeros(2, 2), torch.zeros(2, 2)))
    with pytest.raises(KeyError, match="valid names: dr_grpo, gae, grpo, reinforce_pp, reinforce_pp_baseline, rloo"):
        compute_advantages("ppo2", TokenBatch(mask))
