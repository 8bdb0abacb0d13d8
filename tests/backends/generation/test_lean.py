"""Lean generation backend: the hf backend's results (tokens, log-probs, cuts, seeds), weights, refusals."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from m2flow.backends.generation import (
    HFGenerationBackend,
    LeanGenerationBackend,
    SamplingParams,
    create_generation_backend,
)
from m2flow.data.batch import RolloutBatch
from m2flow.models.causal_lm import response_logprobs
from m2flow.models.tiny import TinyModelConfig, make_tiny_checkpoint

torch.set_num_threads(1)

# Mixed lengths, so rows are left-padded differently.
TEXTS = ("12+7=", "3+4=", "99-1=", "5*5=", "0+0=", "123+456=", "8=")


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def arch_ckpt(request, tmp_path_factory, tok):
    """Qwen2 (tied head) and Llama (untied head) checkpoints, both with grouped-query attention."""
    cfg = TinyModelConfig(arch=request.param, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2,
                          tie_word_embeddings=request.param == "qwen2", seed=5)
    return make_tiny_checkpoint(tmp_path_factory.mktemp(f"lean-{request.param}"), tok, cfg)


@pytest.fixture
def pair(arch_ckpt):
    """An hf and a lean backend over the same checkpoint."""
    return HFGenerationBackend.from_pretrained(arch_ckpt), LeanGenerationBackend.from_pretrained(arch_ckpt)


@pytest.fixture
def backend(ckpt):
    return LeanGenerationBackend.from_pretrained(ckpt)


def _prompts(tok, texts=TEXTS):
    return [tok(t)["input_ids"] for t in texts]


def _tokens(groups):
    return [r.token_ids for g in groups for r in g.responses]


def _flat(groups):
    return [(r.token_ids, r.finish_reason, r.text) for g in groups for r in g.responses]


def test_greedy_tokens_are_the_hf_backends(pair, tok):
    hf, lean = pair
    params = SamplingParams(n=2, temperature=0, max_new_tokens=12)
    want, got = hf.generate(_prompts(tok), params), lean.generate(_prompts(tok), params)
    assert [g.prompt_index for g in got] == list(range(len(TEXTS)))
    assert [g.prompt_ids for g in got] == _prompts(tok)
    assert _flat(got) == _flat(want)
    for g, h in zip(got, want):
        for r, s in zip(g.responses, h.responses):
            assert r.logprobs == pytest.approx(s.logprobs, abs=1e-5)


@pytest.mark.parametrize("temperature,top_k,top_p,drop_finished", [(1.0, 0, 1.0, True), (0.7, 5, 0.9, True),
                                                                   (0.7, 5, 0.9, False)])
def test_same_seed_samples_what_hf_samples(pair, tok, temperature, top_k, top_p, drop_finished):
    # Sampling draws the random stream exactly as HF does, so equal logits give equal samples, whether
    # or not finished rows leave the decoding batch.
    hf, lean = pair
    lean.drop_finished = drop_finished
    params = SamplingParams(n=3, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=10, seed=7)
    assert _flat(lean.generate(_prompts(tok), params)) == _flat(hf.generate(_prompts(tok), params))


def test_logprobs_match_the_trainer_recomputation(pair, tok):
    _, lean = pair
    groups = lean.generate(_prompts(tok), SamplingParams(n=2, max_new_tokens=8, seed=3, temperature=0.7))
    batch = RolloutBatch.from_groups(groups, lean.pad_id)
    with torch.no_grad():
        recomputed, _ = response_logprobs(lean.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                          batch.response_mask, temperature=0.7)
    assert torch.allclose(recomputed, batch.rollout_logprobs, atol=1e-5)


def test_seed_makes_sampling_reproducible(backend, tok):
    params = SamplingParams(n=2, max_new_tokens=6, seed=11)
    a = backend.generate(_prompts(tok), params)
    b = backend.generate(_prompts(tok), params)
    c = backend.generate(_prompts(tok), SamplingParams(n=2, max_new_tokens=6, seed=12))
    assert _tokens(a) == _tokens(b)
    assert _tokens(a) != _tokens(c)
    # Chunks are seeded as the hf backend seeds them.
    chunked = list(backend.generate_iter(_prompts(tok), params, prompts_per_chunk=3))
    hf = HFGenerationBackend(backend.model, backend.tokenizer)
    assert _tokens(chunked) == _tokens(hf.generate_iter(_prompts(tok), params, prompts_per_chunk=3))
    # The caller's random stream is left alone.
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    backend.generate(_prompts(tok), params)
    assert torch.equal(torch.rand(1), before)


# Slow (a second compile of a second model shape); in the default suite the compiled step
# is checked against the eager one in tests/models/test_functional_decode.py and, through this backend,
# in a whole agentic run (tests/workflows/agentic/test_agentic.py).
@pytest.mark.slow
def test_compiled_decoding_samples_what_eager_decoding_samples(ckpt, tok):
    eager = LeanGenerationBackend.from_pretrained(ckpt)
    compiled = LeanGenerationBackend.from_pretrained(ckpt, compile=True)
    sampled = SamplingParams(n=3, max_new_tokens=10, seed=4)
    greedy = SamplingParams(n=2, temperature=0, max_new_tokens=8)
    for params in (sampled, greedy):
        want, got = eager.generate(_prompts(tok), params), compiled.generate(_prompts(tok), params)
        assert _flat(got) == _flat(want)
        for g, w in zip(got, want):
            for r, s in zip(g.responses, w.responses):
                assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(s.logprobs), atol=1e-5)
    assert compiled.decoder.compiled.active


def test_top_k_one_is_greedy(pair, tok):
    _, lean = pair
    greedy = lean.generate(_prompts(tok), SamplingParams(n=2, temperature=0, max_new_tokens=8))
    top1 = lean.generate(_prompts(tok), SamplingParams(n=2, temperature=0.8, top_k=1, max_new_tokens=8, seed=1))
    assert _tokens(top1) == _tokens(greedy)


def test_eos_and_stop_strings_cut_as_in_hf(taught, tok):
    lean = LeanGenerationBackend(taught, tok)
    eos = tok.eos_token_id
    one, seven, nine = (tok.convert_tokens_to_ids(c) for c in "179")
    prompt = [tok("12+7=")["input_ids"]]

    def only(params):
        (r,) = lean.generate(prompt, params)[0].responses
        return r.token_ids, r.finish_reason, r.text

    assert only(SamplingParams(temperature=0, max_new_tokens=8)) == ([one, nine, eos], "stop", "19")
    assert only(SamplingParams(temperature=0, max_new_tokens=1)) == ([one], "length", "1")
    assert only(SamplingParams(temperature=0, max_new_tokens=8, stop=("9",))) == ([one, nine], "stop", "1")
    assert only(SamplingParams(temperature=0, max_new_tokens=8, stop=("19",))) == ([one, nine], "stop", "")
    assert only(SamplingParams(temperature=0, max_new_tokens=8, stop=("+",)))[0] == [one, nine, eos]
    # Rows of a batch stop independently, and the rest of the batch goes on.
    params = SamplingParams(temperature=0, max_new_tokens=8, stop=("9",))
    groups = lean.generate(_prompts(tok, ("12+7=", "3+4=")), params)
    assert _tokens(groups) == [[one, nine], [seven, eos]]
    # Sampled rows, stop strings and end-of-sequence tokens mixed: the hf backend's cuts.
    hf = HFGenerationBackend(taught, tok)
    params = SamplingParams(n=4, temperature=3.0, max_new_tokens=4, stop=("1",), seed=2)
    got, want = _flat(lean.generate(_prompts(tok), params)), _flat(hf.generate(_prompts(tok), params))
    assert got == want
    endings = {(reason, ids[-1] == eos) for ids, reason, _ in got}
    assert endings == {("stop", True), ("stop", False), ("length", False)}  # eos, stop string, budget


def test_weights_loaded_or_changed_in_place_are_used(backend, taught, tok):
    prompt = [tok("12+7=")["input_ids"]]
    greedy = SamplingParams(temperature=0, max_new_tokens=4)
    before = backend.generate(prompt, greedy)[0].responses[0].text
    backend.load_weights(taught.state_dict())
    assert before != "19" and backend.generate(prompt, greedy)[0].responses[0].text == "19"
    with pytest.raises(KeyError, match="unknown parameter name"):
        backend.load_weights({"not.a.weight": torch.zeros(1)})
    # A weight sync that writes into `model` directly (as the rollout worker's does) is noticed too.
    with torch.no_grad():
        for p in backend.model.parameters():
            p.mul_(0.5)
    hf = HFGenerationBackend(backend.model, tok)
    params = SamplingParams(n=2, max_new_tokens=6, seed=1)
    assert _flat(backend.generate(_prompts(tok), params)) == _flat(hf.generate(_prompts(tok), params))


def test_offload_onload(backend, tok):
    prompt = [tok("12+7=")["input_ids"]]
    greedy = SamplingParams(temperature=0, max_new_tokens=4)
    before = backend.generate(prompt, greedy)
    backend.offload()
    with pytest.raises(RuntimeError, match="offloaded"):
        backend.generate(prompt, greedy)
    backend.onload()
    assert _flat(backend.generate(prompt, greedy)) == _flat(before)


def test_registered_as_lean(ckpt):
    backend = create_generation_backend("lean", str(ckpt))
    assert isinstance(backend, LeanGenerationBackend)
    assert backend.pad_id is not None and backend.eos_ids and backend.tokenizer is not None


def test_other_architectures_are_refused(tok):
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=32))
    with pytest.raises(ValueError, match="model type 'gpt2' is not supported"):
        LeanGenerationBackend(model, tok)
