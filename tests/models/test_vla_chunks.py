"""The VLA's action chunks and its two decodings: shapes, forward passes per decision, and log-probs recomputed
from the actions equal to those recorded when sampling."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from m2flow.models.vla import VLAConfig, VLAPolicy
from tests.models.test_vla import packed_obs, small

torch.set_num_threads(1)


def policy(chunk: int, decoding: str = "parallel", logprob: str = "token", seed: int = 0) -> VLAPolicy:
    torch.manual_seed(seed)
    return VLAPolicy(replace(small(), chunk=chunk, decoding=decoding, logprob=logprob), 4)


class ForwardCounter:
    """Counts the transformer's forward passes of a policy."""

    def __init__(self, p: VLAPolicy) -> None:
        self.calls = 0
        p.encoder.norm.register_forward_hook(lambda *_: self._count())  # the final norm: once per pass

    def _count(self) -> None:
        self.calls += 1


def test_parallel_decoding_emits_a_chunk_from_one_forward_pass():
    p = policy(chunk=3)
    obs = packed_obs(p.config, 5)
    counter = ForwardCounter(p)
    out = p.act(obs, generator=torch.Generator().manual_seed(1))
    assert counter.calls == 1
    assert out.actions.shape == (5, 3, 4) and out.logprobs.shape == (5, 12) and out.values.shape == (5,)
    # the actions are bin centres: tokens come back exactly, and every token is its own sample
    tokens = p.bins.to_tokens(out.actions.reshape(5, -1))
    assert torch.equal(p.bins.to_actions(tokens).view(5, 3, 4), out.actions)
    again = p.evaluate(obs, out.actions)
    assert counter.calls == 2
    torch.testing.assert_close(again.logprobs, out.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(again.values, out.values, atol=1e-5, rtol=0)
    assert again.entropy.shape == (5,)


def test_autoregressive_decoding_conditions_each_token_on_the_ones_before():
    p = policy(chunk=2, decoding="autoregressive")
    obs = packed_obs(p.config, 4)
    counter = ForwardCounter(p)
    out = p.act(obs, generator=torch.Generator().manual_seed(2))
    assert counter.calls == 8  # one forward pass per token of the 2 x 4 chunk
    assert out.actions.shape == (4, 2, 4) and out.logprobs.shape == (4, 8)
    again = p.evaluate(obs, out.actions)  # teacher forcing: one pass, the same log-probs
    assert counter.calls == 9
    torch.testing.assert_close(again.logprobs, out.logprobs, atol=1e-5, rtol=0)
    tokens = p.bins.to_tokens(out.actions.reshape(4, -1))
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 7) % p.config.num_bins
    base, moved = p.token_outputs(obs, tokens), p.token_outputs(obs, changed)
    # tokens 0..5 do not read token 5; token 6 does; the value reads no token
    torch.testing.assert_close(moved.logprobs[:, :5], base.logprobs[:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(moved.logprobs[:, 6], base.logprobs[:, 6])
    torch.testing.assert_close(moved.values, base.values, atol=1e-6, rtol=0)
    greedy = p.act(obs, deterministic=True)
    step = p.token_outputs(obs, p.bins.to_tokens(greedy.actions.reshape(4, -1)))
    logits, _ = p(obs, p.bins.to_tokens(greedy.actions.reshape(4, -1)))
    assert torch.equal(logits.argmax(-1), p.bins.to_tokens(greedy.actions.reshape(4, -1)))
    torch.testing.assert_close(step.logprobs, greedy.logprobs, atol=1e-5, rtol=0)


def test_parallel_tokens_are_independent_given_the_observation():
    p = policy(chunk=2)
    obs = packed_obs(p.config, 3)
    tokens = torch.randint(0, p.config.num_bins, (3, 8), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 0] = (changed[:, 0] + 3) % p.config.num_bins
    base, moved = p.token_outputs(obs, tokens), p.token_outputs(obs, changed)
    torch.testing.assert_close(moved.logprobs[:, 1:], base.logprobs[:, 1:], atol=1e-6, rtol=0)


def test_one_log_prob_per_chunk_is_the_sum_of_its_tokens():
    per_token, per_chunk = policy(chunk=2), policy(chunk=2, logprob="action")
    obs = packed_obs(per_token.config, 3)
    a = per_token.act(obs, generator=torch.Generator().manual_seed(3))
    b = per_chunk.act(obs, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.actions, b.actions) and b.logprobs.shape == (3,)
    torch.testing.assert_close(b.logprobs, a.logprobs.sum(-1))


def test_chunk_one_parallel_keeps_the_parameters_of_the_single_action_policy():
    p = policy(chunk=1)
    assert p.queries.shape == (1, 5, 32) and p.token_embed is None
    assert "token_embed.weight" not in p.state_dict()
    out = p.act(packed_obs(p.config, 2))
    assert out.actions.shape == (2, 4) and out.logprobs.shape == (2, 4)
    assert policy(chunk=1, decoding="autoregressive").queries.shape == (1, 5, 32)


def test_bad_chunk_and_decoding_fail_naming_the_key():
    with pytest.raises(ValueError, match="chunk"):
        replace(small(), chunk=0).validate()
    with pytest.raises(ValueError, match="decoding"):
        replace(small(), decoding="beam").validate()
