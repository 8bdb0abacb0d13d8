"""Response log-probs, entropy and the value-head critic, checked against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from m2flow.data.arithmetic import ARITHMETIC_ALPHABET
from m2flow.data.batch import left_pad, right_pad
from m2flow.models.causal_lm import (
    CausalLMWithValueHead,
    entropy_from_logits,
    load_causal_lm,
    logprobs_from_logits,
    position_ids_from_mask,
    response_logprobs,
)
from m2flow.models.tiny import TinyModelConfig, make_tiny_checkpoint
from m2flow.models.tokenizer import train_char_tokenizer

torch.set_num_threads(1)

PROMPTS = [[5, 6, 14, 11, 18], [9, 18], [17, 17, 7, 8, 9, 10, 18]]
RESPONSES = [[10, 1], [12, 13, 14, 1], [8]]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tok = train_char_tokenizer([ARITHMETIC_ALPHABET])
    return make_tiny_checkpoint(tmp_path_factory.mktemp("m"), tok, TinyModelConfig(hidden_size=32, intermediate_size=64))


@pytest.fixture(scope="module")
def model(ckpt):
    return load_causal_lm(ckpt)


def _batch(prompts, responses, extra_prompt_pad=0, extra_response_pad=0):
    p_ids, p_mask = left_pad(prompts, 0, max(map(len, prompts)) + extra_prompt_pad)
    width = max(map(len, responses)) + extra_response_pad
    r_ids = right_pad(responses, 0, width)
    r_mask = right_pad([[1] * len(r) for r in responses], 0, width)
    return p_ids, p_mask, r_ids, r_mask


def test_logprobs_from_logits_by_hand():
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)]]])  # (1, 2, 2)
    labels = torch.tensor([[0, 1]])
    got = logprobs_from_logits(logits, labels)
    assert torch.allclose(got, torch.tensor([[math.log(0.5), math.log(0.75)]]))
    # Temperature 2 halves the logits: [0, ln3 / 2] -> p(1) = sqrt(3) / (1 + sqrt(3)).
    hot = logprobs_from_logits(logits, labels, temperature=2.0)
    assert torch.allclose(hot[0, 1], torch.tensor(math.log(math.sqrt(3) / (1 + math.sqrt(3)))))
    assert torch.allclose(entropy_from_logits(torch.zeros(1, 1, 4)), torch.tensor([[math.log(4.0)]]))


def test_position_ids_ignore_left_padding():
    assert position_ids_from_mask(torch.tensor([[0, 0, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2]]


def test_response_logprobs_equal_a_manual_log_softmax_gather(model):
    got, ent = response_logprobs(model, *_batch(PROMPTS, RESPONSES), return_entropy=True)
    assert got.shape == ent.shape == (3, 4)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        with torch.no_grad():
            logits = model(torch.tensor([p + r])).logits[0]  # unpadded, one row at a time
        logp = torch.log_softmax(logits, -1)
        want = torch.tensor([logp[len(p) - 1 + t, tok] for t, tok in enumerate(r)])
        assert torch.allclose(got[i, : len(r)], want, atol=1e-5)
        assert torch.all(got[i, len(r) :] == 0) and torch.all(ent[i, len(r) :] == 0)
        probs = logp.exp()[len(p) - 1 : len(p) - 1 + len(r)]
        assert torch.allclose(ent[i, : len(r)], -(probs * probs.log()).sum(-1), atol=1e-5)


def test_logprobs_invariant_to_padding_and_micro_batches(model):
    with torch.no_grad():
        base, _ = response_logprobs(model, *_batch(PROMPTS, RESPONSES))
        padded, _ = response_logprobs(model, *_batch(PROMPTS, RESPONSES, extra_prompt_pad=4, extra_response_pad=3))
        micro, _ = response_logprobs(model, *_batch(PROMPTS, RESPONSES), micro_batch_size=2)
    assert padded.shape == (3, 7)
    assert torch.allclose(padded[:, :4], base, atol=1e-5) and torch.all(padded[:, 4:] == 0)
    assert torch.allclose(micro, base, atol=1e-5)


def test_gradients_flow_for_training(model):
    logp, _ = response_logprobs(model, *_batch(PROMPTS, RESPONSES))
    logp.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)


def test_load_refuses_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="only loaded from local paths"):
        load_causal_lm(tmp_path / "not-there")
    with pytest.raises(FileNotFoundError):
        CausalLMWithValueHead.from_pretrained(tmp_path / "not-there")


def test_value_head_shapes_alignment_and_round_trip(ckpt, model, tmp_path):
    critic = CausalLMWithValueHead.from_pretrained(ckpt)
    # The trunk is the causal LM's own transformer.
    assert torch.equal(critic.trunk.embed_tokens.weight, model.model.embed_tokens.weight)
    p_ids, p_mask, r_ids, r_mask = _batch(PROMPTS, RESPONSES)
    with torch.no_grad():
        values = critic.response_values(p_ids, p_mask, r_ids, r_mask)
        full = critic(torch.tensor([PROMPTS[1] + RESPONSES[1]]), torch.ones(1, 6, dtype=torch.long))
    assert values.shape == (3, 4) and full.shape == (1, 6)
    # Value of response token t is read at the position just before it.
    assert torch.allclose(values[1], full[0, 1:5], atol=1e-5)
    assert torch.all(values[2, 1:] == 0)
    critic.save_pretrained(tmp_path / "critic")
    again = CausalLMWithValueHead.from_pretrained(tmp_path / "critic")
    with torch.no_grad():
        assert torch.allclose(again.response_values(p_ids, p_mask, r_ids, r_mask), values)
