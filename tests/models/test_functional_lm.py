"""The functional Qwen2/Llama forward against the HF model: logits, gradients, cached decoding, refusals."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from m2flow.models.causal_lm import position_ids_from_mask
from m2flow.models.functional_lm import FunctionalLM, check_supported, functional_logits

torch.set_num_threads(1)

VOCAB = 37


def _model(arch: str = "qwen2", seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny model with weights large enough that its logits are O(1) (HF's init makes them ~0)."""
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, tie_word_embeddings=True)
    kw.update(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config_cls(**kw))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1 + 0.1 * torch.randn_like(p))
                else:
                    p.normal_(0, 0.3)
    return model.eval()


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of length 9: no padding, left padding, left and right padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :2] = 0
    mask[2, -3:] = 0
    return ids, mask


def _hf_logits(model, ids, mask, keep=0):
    pos = position_ids_from_mask(mask)
    return model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits


MODELS = {
    "qwen2-gqa-tied": dict(arch="qwen2"),
    "qwen2-mha-untied": dict(arch="qwen2", num_key_value_heads=4, tie_word_embeddings=False),
    "llama-gqa-untied": dict(arch="llama", tie_word_embeddings=False),
    "llama-mqa-biases": dict(arch="llama", num_key_value_heads=1, attention_bias=True, mlp_bias=True),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_logits_match_hf_at_real_positions(name):
    model = _model(**MODELS[name])
    ids, mask = _batch()
    with torch.no_grad():
        want = _hf_logits(model, ids, mask)
        got = functional_logits(model, ids, mask)
        assert got.shape == want.shape == (3, 9, VOCAB)
        real = mask.bool()
        assert want[real].abs().max() > 1  # the comparison is not between two near-zero tensors
        torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
        # logits_to_keep keeps the last positions, as HF's does.
        kept = functional_logits(model, ids, mask, logits_to_keep=4)
        assert kept.shape == (3, 4, VOCAB)
        torch.testing.assert_close(kept[real[:, -4:]], want[:, -4:][real[:, -4:]], rtol=0, atol=1e-5)
        # Without a mask: plain causal attention over positions 0..L-1.
        torch.testing.assert_close(functional_logits(model, ids), model(input_ids=ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["qwen2-gqa-tied", "llama-mqa-biases"])
def test_gradients_match_hf(name):
    ids, mask = _batch(seed=1)
    targets = torch.roll(ids, -1, dims=1)

    def grads(forward):
        model = _model(**MODELS[name])
        logits = forward(model)[:, :-1]
        logp = torch.log_softmax(logits, -1).gather(-1, targets[:, :-1, None]).squeeze(-1)
        loss = -(logp * mask[:, 1:] * mask[:, :-1]).sum()
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}

    want = grads(lambda m: _hf_logits(m, ids, mask))
    got = grads(lambda m: functional_logits(m, ids, mask))
    assert want.keys() == got.keys()
    for n in want:
        assert want[n] is not None and got[n] is not None, n
        torch.testing.assert_close(got[n], want[n], rtol=0, atol=1e-5, msg=n)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cached_decoding_matches_full_forwards(name):
    model = _model(**MODELS[name])
    ids, mask = _batch(seed=2)
    ids, mask = ids[:2], mask[:2]  # left padding only: prompts end at the last column
    functional = FunctionalLM.from_hf(model)
    logits, state = functional.prefill(ids, mask, max_new_tokens=4)
    for _ in range(4):
        with torch.no_grad():
            want = _hf_logits(model, ids, mask, keep=1)[:, -1]
        torch.testing.assert_close(logits, want, rtol=0, atol=1e-5)
        token = logits.argmax(-1)
        ids = torch.cat([ids, token[:, None]], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        if state.length < ids.shape[1]:
            logits = functional.decode(token, state)


def test_dropping_rows_keeps_the_others_going():
    model = _model()
    ids, mask = _batch(seed=3)
    ids, mask = ids[:2], mask[:2]
    functional = FunctionalLM.from_hf(model)
    logits, state = functional.prefill(ids, mask, max_new_tokens=2)
    token = logits.argmax(-1)
    state.select(torch.tensor([1]))
    got = functional.decode(token[1:], state)
    full = torch.cat([ids[1:], token[1:, None]], 1)
    full_mask = torch.cat([mask[1:], torch.ones(1, 1, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(got, _hf_logits(model, full, full_mask)[:, -1], rtol=0, atol=1e-5)


def test_repeated_prompts_are_prefilled_once_and_decode_as_copies():
    model = _model(arch="llama")
    ids, mask = _batch(seed=4)
    ids, mask = ids[:2], mask[:2]
    functional = FunctionalLM.from_hf(model)
    once, state = functional.prefill(ids, mask, max_new_tokens=2, repeats=3)
    full, full_state = functional.prefill(ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), max_new_tokens=2)
    assert once.shape == (6, VOCAB)
    torch.testing.assert_close(once, full, rtol=0, atol=1e-6)
    tokens = torch.arange(6) + 1  # different continuations of the copies
    torch.testing.assert_close(functional.decode(tokens, state), functional.decode(tokens, full_state), rtol=0, atol=1e-6)


def test_fused_weights_follow_in_place_updates():
    model = _model()
    ids, mask = _batch()
    functional = FunctionalLM.from_hf(model)
    before, _ = functional.prefill(ids[:2], mask[:2], 1)
    assert not functional.stale
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(2)  # e.g. an optimizer step or a weight sync
    assert functional.stale
    after, _ = functional.prefill(ids[:2], mask[:2], 1)
    with torch.no_grad():
        torch.testing.assert_close(after, _hf_logits(model, ids[:2], mask[:2], keep=1)[:, -1], rtol=0, atol=1e-5)
    assert not torch.allclose(before, after)


@pytest.mark.parametrize(
    "overrides, feature",
    [
        (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope scaling"),
        (dict(use_sliding_window=True, sliding_window=4, max_window_layers=0), "sliding window"),
        (dict(hidden_act="gelu"), "activation 'gelu'"),
    ],
)
def test_unsupported_features_are_refused_by_name(overrides, feature):
    model = _model(**overrides)
    with pytest.raises(ValueError, match=feature):
        FunctionalLM.from_hf(model)
    with pytest.raises(ValueError, match=feature):
        functional_logits(model, torch.ones(1, 2, dtype=torch.long))


def test_other_architectures_are_refused():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    with pytest.raises(ValueError, match="model type 'gpt2' is not supported"):
        FunctionalLM.from_hf(model)
    check_supported(_model().config)  # the supported ones pass
