"""HF generation backend: groups, stop strings, lengths, seeds, early emission, log-probs, weights."""

from __future__ import annotations

import pytest
import torch

from m2flow.backends.generation import HFGenerationBackend, SamplingParams
from m2flow.data.batch import RolloutBatch
from m2flow.models.causal_lm import load_model_and_tokenizer, response_logprobs

torch.set_num_threads(1)


@pytest.fixture
def backend(ckpt):
    return HFGenerationBackend.from_pretrained(ckpt)


@pytest.fixture
def greedy_backend(taught, tok):
    return HFGenerationBackend(taught, tok)


def _prompts(tok, texts=("12+7=", "3+4=", "99-1=", "5*5=", "0+0=")):
    return [tok(t)["input_ids"] for t in texts]


def test_n_responses_per_prompt_in_prompt_order(backend, tok):
    groups = backend.generate(_prompts(tok), SamplingParams(n=3, max_new_tokens=6, seed=0))
    assert [g.prompt_index for g in groups] == [0, 1, 2, 3, 4]
    assert [g.prompt_ids for g in groups] == _prompts(tok)
    for g in groups:
        assert len(g.responses) == 3
        for r in g.responses:
            assert len(r.logprobs) == len(r.token_ids)
            assert all(lp <= 0 for lp in r.logprobs)
            # A response ends right after its end-of-sequence token, within the budget; without one,
            # 'length' means the budget of 6 was used up.
            if tok.eos_token_id in r.token_ids:
                assert r.token_ids.index(tok.eos_token_id) == len(r.token_ids) - 1 < 6 and r.finish_reason == "stop"
            else:
                assert r.finish_reason == "length" and len(r.token_ids) == 6


def test_greedy_answer_stop_and_length(greedy_backend, tok):
    eos = tok.eos_token_id
    one, seven, nine = (tok.convert_tokens_to_ids(c) for c in "179")
    prompt = [tok("12+7=")["input_ids"]]
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    (r,) = greedy_backend.generate(prompt, greedy)[0].responses
    assert (r.token_ids, r.finish_reason, r.text) == ([one, nine, eos], "stop", "19")
    # max_new_tokens cuts it short.
    (r,) = greedy_backend.generate(prompt, SamplingParams(temperature=0, max_new_tokens=1))[0].responses
    assert (r.token_ids, r.finish_reason, r.text) == ([one], "length", "1")
    # A stop string ends the response at the token that completes it; the text stops before it.
    (r,) = greedy_backend.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8, stop=("9",)))[0].responses
    assert (r.token_ids, r.finish_reason, r.text) == ([one, nine], "stop", "1")
    # A stop string spanning two tokens.
    (r,) = greedy_backend.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8, stop=("19",)))[0].responses
    assert (r.token_ids, r.finish_reason, r.text) == ([one, nine], "stop", "")
    # Stop strings only look at generated text: '+' is in the prompt, not in the answer.
    (r,) = greedy_backend.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8, stop=("+",)))[0].responses
    assert r.token_ids == [one, nine, eos]
    # Rows of a batch stop independently.
    groups = greedy_backend.generate(_prompts(tok, ("12+7=", "3+4=")), SamplingParams(temperature=0, max_new_tokens=8, stop=("9",)))
    assert groups[0].responses[0].token_ids == [one, nine]
    assert groups[1].responses[0].token_ids == [seven, eos]


def test_seed_makes_sampling_reproducible(backend, tok):
    params = SamplingParams(n=2, max_new_tokens=6, seed=11)
    a = backend.generate(_prompts(tok), params)
    b = backend.generate(_prompts(tok), params)
    c = backend.generate(_prompts(tok), SamplingParams(n=2, max_new_tokens=6, seed=12))
    tokens = lambda gs: [r.token_ids for g in gs for r in g.responses]  # noqa: E731
    assert tokens(a) == tokens(b)
    assert tokens(a) != tokens(c)
    # The caller's random stream is left alone.
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    backend.generate(_prompts(tok), params)
    assert torch.equal(torch.rand(1), before)


def test_groups_are_emitted_chunk_by_chunk(backend, tok, monkeypatch):
    calls = []
    original = backend.model.generate

    def counting_generate(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(backend.model, "generate", counting_generate)
    it = backend.generate_iter(_prompts(tok), SamplingParams(n=2, max_new_tokens=4, seed=0), prompts_per_chunk=2)
    first = next(it)
    # The first group is out after one chunk of 2 prompts x 2 samples; the rest is not generated yet.
    assert first.prompt_index == 0 and calls == [4]
    rest = list(it)
    assert [g.prompt_index for g in rest] == [1, 2, 3, 4]
    assert calls == [4, 4, 2]
    # Chunked generation with a seed is reproducible too.
    again = list(backend.generate_iter(_prompts(tok), SamplingParams(n=2, max_new_tokens=4, seed=0), prompts_per_chunk=2))
    assert [r.token_ids for g in [first] + rest for r in g.responses] == [r.token_ids for g in again for r in g.responses]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_the_trainer_recomputation(backend, tok, temperature, top_p):
    groups = backend.generate(_prompts(tok), SamplingParams(n=2, max_new_tokens=6, seed=3, temperature=temperature, top_p=top_p))
    batch = RolloutBatch.from_groups(groups, backend.pad_id)
    with torch.no_grad():
        recomputed, _ = response_logprobs(
            backend.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask, temperature=temperature
        )
    assert torch.allclose(recomputed, batch.rollout_logprobs, atol=1e-4)


def test_checkpoint_generation_defaults_do_not_leak_in(backend, tok):
    # Shipped generation configs often carry sampling defaults; the backend's parameters must win.
    cfg = backend.model.generation_config
    cfg.repetition_penalty, cfg.temperature, cfg.top_k, cfg.min_new_tokens = 3.0, 0.2, 2, 5
    groups = backend.generate(_prompts(tok), SamplingParams(n=2, max_new_tokens=6, seed=4))
    batch = RolloutBatch.from_groups(groups, backend.pad_id)
    with torch.no_grad():
        recomputed, _ = response_logprobs(backend.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    assert torch.allclose(recomputed, batch.rollout_logprobs, atol=1e-4)
    (r,) = backend.generate(_prompts(tok)[:1], SamplingParams(temperature=0, max_new_tokens=6))[0].responses
    with torch.no_grad():
        logits = backend.model(torch.tensor([_prompts(tok)[0]])).logits[0, -1]
    assert r.token_ids[0] == int(logits.argmax())


def test_load_weights_offload_onload(backend, greedy_backend, tok, ckpt):
    prompt = [tok("12+7=")["input_ids"]]
    greedy = SamplingParams(temperature=0, max_new_tokens=4)
    backend.load_weights(greedy_backend.model.state_dict())
    assert backend.generate(prompt, greedy)[0].responses[0].text == "19"
    with pytest.raises(KeyError, match="unknown parameter name"):
        backend.load_weights({"not.a.weight": torch.zeros(1)})
    backend.offload()
    with pytest.raises(RuntimeError, match="offloaded"):
        backend.generate(prompt, greedy)
    backend.onload()
    assert backend.generate(prompt, greedy)[0].responses[0].text == "19"
    # The checkpoint on disk is untouched by weight loading.
    fresh, _ = load_model_and_tokenizer(ckpt)
    assert not torch.equal(fresh.model.embed_tokens.weight, backend.model.model.embed_tokens.weight)
