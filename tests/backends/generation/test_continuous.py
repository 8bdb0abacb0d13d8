"""Continuous batching (lean backend): the chunked path's greedy results, draws seeded per prompt whatever
the batch, every group exactly once, groups handed out before the batch is done."""

from __future__ import annotations

import pytest
import torch

from m2flow.backends.generation import LeanGenerationBackend, SamplingParams
from m2flow.backends.generation.continuous import inverse_cdf_sample

torch.set_num_threads(1)

TEXTS = ("12+7=", "3+4=", "99-1=", "5*5=", "0+0=", "123+456=", "8=", "41-9=", "7*3=")


def _prompts(tok, texts=TEXTS):
    return [tok(t)["input_ids"] for t in texts]


def _flat(groups):
    return [(g.prompt_index, [(r.token_ids, r.finish_reason, r.text) for r in g.responses]) for g in groups]


def _stream(backend, prompts, params, max_running, seeds=None):
    seeds = list(range(100, 100 + len(prompts))) if seeds is None else seeds
    batches = list(backend.generate_stream(prompts, params, seeds, max_running))
    return batches, sorted((g for b in batches for g in b), key=lambda g: g.prompt_index)


@pytest.mark.parametrize("max_running", [2, 5, 64])
def test_greedy_groups_are_the_chunked_paths(ckpt, tok, max_running):
    backend = LeanGenerationBackend.from_pretrained(ckpt)
    params = SamplingParams(n=2, temperature=0, max_new_tokens=7, stop=("9",))
    want = backend.generate(_prompts(tok), params)
    _, got = _stream(backend, _prompts(tok), params, max_running)
    assert _flat(got) == _flat(want)
    for g, w in zip(got, want):
        for r, s in zip(g.responses, w.responses):
            assert r.logprobs == pytest.approx(s.logprobs, abs=1e-5)


def test_a_prompts_responses_depend_on_its_seed_only(ckpt, tok):
    backend = LeanGenerationBackend.from_pretrained(ckpt)
    params = SamplingParams(n=3, temperature=1.5, top_k=20, max_new_tokens=6)
    prompts, seeds = _prompts(tok), list(range(7, 7 + len(TEXTS)))
    _, alone = _stream(backend, prompts, params, max_running=3, seeds=seeds)  # one prompt at a time
    _, crowded = _stream(backend, prompts, params, max_running=64, seeds=seeds)  # all at once
    _, again = _stream(backend, prompts, params, max_running=64, seeds=seeds)
    # The same prompts and seeds in reverse order: each prompt keeps its responses.
    _, reverse = _stream(backend, prompts[::-1], params, max_running=7, seeds=seeds[::-1])
    assert _flat(alone) == _flat(crowded) == _flat(again)
    assert [g[1] for g in _flat(reverse)[::-1]] == [g[1] for g in _flat(alone)]
    _, other = _stream(backend, prompts, params, max_running=64, seeds=[s + 1 for s in seeds])
    assert _flat(other) != _flat(alone)


def test_every_group_once_and_the_first_before_the_last_prompt_starts(ckpt, tok):
    backend = LeanGenerationBackend.from_pretrained(ckpt)
    prompts = _prompts(tok) * 30  # 270 prompts
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5)
    it = backend.generate_stream(prompts, params, list(range(len(prompts))), max_running=16)
    first = next(it)
    # At most 8 prompts run at once: the first groups leave while most prompts have not even started.
    assert 1 <= len(first) <= 8
    batches = [first, *it]
    indices = [g.prompt_index for b in batches for g in b]
    assert sorted(indices) == list(range(len(prompts)))
    assert len(batches) > len(prompts) // 8  # groups left in many batches, not in one at the end
    for g in (g for b in batches for g in b):
        assert g.prompt_ids == list(prompts[g.prompt_index]) and len(g.responses) == 2


def test_refuses_a_batch_smaller_than_a_group_and_seed_lists_of_the_wrong_length(ckpt, tok):
    backend = LeanGenerationBackend.from_pretrained(ckpt)
    params = SamplingParams(n=4, max_new_tokens=3)
    with pytest.raises(ValueError, match="max_running"):
        list(backend.generate_stream(_prompts(tok), params, list(range(len(TEXTS))), max_running=3))
    with pytest.raises(ValueError, match="one seed per prompt"):
        list(backend.generate_stream(_prompts(tok), params, [0], max_running=8))


def test_inverse_cdf_sampling_follows_the_distribution():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).repeat(1000, 1)
    u = (torch.arange(1000, dtype=torch.float64) + 0.5) / 1000  # evenly spread over [0, 1)
    counts = torch.bincount(inverse_cdf_sample(probs, u), minlength=4)
    assert counts.tolist() == [100, 0, 600, 300]
    # Against a plain loop: the first token whose cumulative probability exceeds u.
    g = torch.Generator().manual_seed(0)
    p = torch.rand(50, 9, generator=g) ** 3
    u = torch.rand(50, generator=g)
    want = [next(k for k in range(9) if float(p[i, : k + 1].sum()) > float(u[i]) * float(p[i].sum()))
            for i in range(50)]
    assert inverse_cdf_sample(p, u).tolist() == want


def _turn(backend, contexts, params, seeds, prefixes=None, keep=None):
    stream = backend.generate_stream(contexts, params, seeds, 4, prefixes, keep)
    return sorted((g for b in stream for g in b), key=lambda g: g.prompt_index)


def _next_contexts(tok, prompts, groups):
    """Each prompt, its response and an observation: the context of a second turn."""
    seen = tok("+1=", add_special_tokens=False)["input_ids"]
    return [list(p) + g.responses[0].token_ids + seen for p, g in zip(prompts, groups)]


def test_a_context_continued_from_its_kept_cache_plays_as_the_whole_context(ckpt, tok):
    backend = LeanGenerationBackend.from_pretrained(ckpt)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=6, stop=("9",))
    prompts, seeds = _prompts(tok), list(range(len(TEXTS)))
    keep: dict = {}
    first = _turn(backend, prompts, params, seeds, keep=keep)
    assert sorted(keep) == list(range(len(TEXTS)))
    for i, g in enumerate(first):  # the prompt and every generated token but the last (never run)
        ran = list(prompts[i]) + g.responses[0].token_ids[:-1]
        assert list(keep[i].ids) == ran and keep[i].keys.shape[2] == len(ran)
    contexts = _next_contexts(tok, prompts, first)
    whole = _turn(backend, contexts, params, seeds)
    continued = _turn(backend, contexts, params, seeds, prefixes=[keep[i] for i in range(len(TEXTS))])
    assert _flat(continued) == _flat(whole)
    for g, w in zip(continued, whole):
        assert g.responses[0].logprobs == pytest.approx(w.responses[0].logprobs, abs=1e-5)
    # Another row's cache serves only the tokens both contexts begin with: the results stay the same.
    shifted = [keep[(i + 1) % len(TEXTS)] for i in range(len(TEXTS))]
    assert _flat(_turn(backend, contexts, params, seeds, prefixes=shifted)) == _flat(whole)


def test_a_cache_of_other_weights_is_not_reused(ckpt, tok):
    backend = LeanGenerationBackend.from_pretrained(ckpt)
    params = SamplingParams(n=1, temperature=0, max_new_tokens=5)
    prompts, seeds = _prompts(tok), list(range(len(TEXTS)))
    keep: dict = {}
    contexts = _next_contexts(tok, prompts, _turn(backend, prompts, params, seeds, keep=keep))
    with torch.no_grad():  # an update of the weights between the turns
        for p in backend.model.parameters():
            p.mul_(1.5)
    whole = _turn(backend, contexts, params, seeds)
    continued = _turn(backend, contexts, params, seeds, prefixes=[keep[i] for i in range(len(TEXTS))])
    assert _flat(continued) == _flat(whole)
    for g, w in zip(continued, whole):
        assert g.responses[0].logprobs == pytest.approx(w.responses[0].logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="one prefix"):
        _turn(backend, contexts, params, seeds, prefixes=[None])


def test_prompts_given_twice_in_one_batch_get_their_own_responses(ckpt, tok):
    # The same prompt several times among others (a group's episodes at their first turn): it runs once
    # and its rows are copied, so every prompt must still get the responses it gets alone.
    backend = LeanGenerationBackend.from_pretrained(ckpt)
    params = SamplingParams(n=2, temperature=0, max_new_tokens=6)
    order = [0, 0, 1, 5, 1, 0, 2, 5, 3]
    prompts = [_prompts(tok)[i] for i in order]
    _, got = _stream(backend, prompts, params, max_running=64, seeds=[0] * len(prompts))
    alone = {i: _stream(backend, [_prompts(tok)[i]], params, max_running=2, seeds=[0])[1][0] for i in set(order)}
    assert [[r.token_ids for r in g.responses] for g in got] == [[r.token_ids for r in alone[i].responses] for i in order]
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=6)  # sampled: each prompt by its own seed
    seeds = list(range(len(prompts)))
    _, got = _stream(backend, prompts, params, max_running=64, seeds=seeds)
    for g, i, seed in zip(got, order, seeds):
        one = _stream(backend, [_prompts(tok)[i]], params, max_running=1, seeds=[seed])[1][0]
        assert g.responses[0].token_ids == one.responses[0].token_ids
