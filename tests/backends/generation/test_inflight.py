"""Interruptible continuous batching: weights that change under rows in flight, rows paused and resumed.
Every token's recorded version and log-prob must be those of a teacher-forced forward of its whole
context under the weights of that version (the stream runs a context again after an update)."""

from __future__ import annotations

import pytest
import torch

from m2flow.backends.generation import LeanGenerationBackend, SamplingParams
from m2flow.backends.generation.inflight import InFlight, PartialResponse
from m2flow.models.tiny import TinyModelConfig, build_tiny_model

torch.set_num_threads(1)

TEXTS = ("12+7=", "3+4=", "99-1=", "5*5=", "0+0=", "123+456=", "8=")
CFG = TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=128)


@pytest.fixture(scope="module")
def weights(tok):
    """Three unrelated random weight sets of one tiny Qwen2 shape, by version 0, 1, 2."""
    return {v: build_tiny_model(CFG.__class__(**{**CFG.__dict__, "seed": v}), tok).state_dict() for v in range(3)}


def _backend(tok, weights):
    model = build_tiny_model(CFG, tok)
    model.load_state_dict(weights[0])
    return LeanGenerationBackend(model, tok)


def _updates(backend, weights, at):
    """A poll that loads version v's weights on its ``at[v]``-th call (counting from 1)."""
    calls = [0]

    def poll():
        calls[0] += 1
        for v, when in at.items():
            if calls[0] == when:
                backend.load_weights(weights[v])
                return v
        return None

    return poll


def _recomputed(tok, weights, prompt, tokens, version, temperature):
    """Log-probs (len(tokens),) of ``tokens`` after ``prompt`` by one teacher-forced HF forward under ``version``."""
    model = build_tiny_model(CFG, tok)
    model.load_state_dict(weights[version])
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def _check_tokens(tok, weights, prompts, groups, temperature):
    """Every token's log-prob equals the recomputation under its recorded version; returns the rows' versions."""
    seen = []
    for g in groups:
        for r in g.responses:
            assert len(r.versions) == len(r.token_ids) == len(r.logprobs)
            for v in sorted(set(r.versions)):
                want = _recomputed(tok, weights, prompts[g.prompt_index], r.token_ids, v, temperature)
                at = [t for t, rv in enumerate(r.versions) if rv == v]
                assert torch.tensor(r.logprobs)[at] == pytest.approx(want[at], abs=1e-4), (g.prompt_index, v)
            assert r.versions == sorted(r.versions)  # versions only go up along a row
            seen.append(r.versions)
    return seen


def test_weights_updated_mid_generation_every_token_has_its_versions_log_prob(tok, weights):
    backend = _backend(tok, weights)
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)
    flight = InFlight(version=0, poll=_updates(backend, weights, {1: 5, 2: 14}))
    groups = [g for b in backend.generate_stream(prompts, params, list(range(len(prompts))), 6, flight=flight)
              for g in b]
    assert sorted(g.prompt_index for g in groups) == list(range(len(prompts)))
    assert flight.updates == 2
    rows = _check_tokens(tok, weights, prompts, groups, params.temperature)
    assert any(len(set(v)) > 1 for v in rows)  # rows that crossed an update
    assert any(v[0] == 0 for v in rows) and any(v[0] >= 1 for v in rows)  # rows admitted before and after
    # The check tells the versions apart: a crossing row's later tokens are not the old weights' samples.
    g = next(g for g in groups for r in g.responses if len(set(r.versions)) > 1)
    r = next(r for r in g.responses if len(set(r.versions)) > 1)
    late = [t for t, v in enumerate(r.versions) if v > r.versions[0]]
    old = _recomputed(tok, weights, prompts[g.prompt_index], r.token_ids, r.versions[0], params.temperature)
    assert (torch.tensor(r.logprobs)[late] - old[late]).abs().max() > 1e-2


def test_a_stream_closed_early_resumes_as_if_never_paused(tok, weights):
    backend = _backend(tok, weights)
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=10, stop=("9",))
    seeds = list(range(40, 40 + len(prompts)))
    whole = {g.prompt_index: g for b in backend.generate_stream(prompts, params, seeds, 8) for g in b}
    flight = InFlight()
    stream = backend.generate_stream(prompts, params, seeds, 8, flight=flight)
    first = next(stream)
    stream.close()
    assert flight.paused and not set(flight.paused) & {g.prompt_index for g in first}
    for rows in flight.paused.values():
        assert all(isinstance(r, PartialResponse) for r in rows) and len(rows) == params.n
    rest = [p for p in range(len(prompts)) if p not in {g.prompt_index for g in first}]
    again = InFlight(started=[flight.paused.get(p) for p in rest])
    resumed = {rest[g.prompt_index]: g for b in backend.generate_stream([prompts[p] for p in rest], params,
                                                                         [seeds[p] for p in rest], 8, flight=again)
               for g in b}
    got = {g.prompt_index: g for g in first} | resumed
    assert sorted(got) == sorted(whole)
    for p, g in got.items():
        for r, w in zip(g.responses, whole[p].responses):
            assert (r.token_ids, r.finish_reason, r.text) == (w.token_ids, w.finish_reason, w.text)
            assert r.logprobs == pytest.approx(w.logprobs, abs=1e-5)


def test_rows_resumed_under_new_weights_keep_their_old_tokens_versions(tok, weights):
    backend = _backend(tok, weights)
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    params = SamplingParams(n=2, temperature=0.8, max_new_tokens=12)
    seeds = list(range(len(prompts)))
    flight = InFlight(version=0)
    stream = backend.generate_stream(prompts, params, seeds, 14, flight=flight)
    next(stream)  # the first groups out; every other row has sampled some tokens: pause
    stream.close()
    backend.load_weights(weights[1])  # the weight sync between two steps
    paused = sorted(flight.paused)
    assert paused
    again = InFlight(version=1, started=[flight.paused[p] for p in paused])
    groups = [g for b in backend.generate_stream([prompts[p] for p in paused], params, [seeds[p] for p in paused],
                                                  14, flight=again) for g in b]
    assert len(groups) == len(paused)
    rows = _check_tokens(tok, weights, [prompts[p] for p in paused], groups, params.temperature)
    assert any(v[0] == 0 and v[-1] == 1 for v in rows)


def test_started_rows_must_match_the_prompts(tok, weights):
    backend = _backend(tok, weights)
    prompts = [tok(t)["input_ids"] for t in TEXTS[:2]]
    params = SamplingParams(n=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="one list of started rows"):
        list(backend.generate_stream(prompts, params, [0, 1], 4, flight=InFlight(started=[None])))
    one = [PartialResponse([5], [-1.0], [0])]
    with pytest.raises(ValueError, match="started rows, not n=2"):
        list(backend.generate_stream(prompts, params, [0, 1], 4, flight=InFlight(started=[one, None])))
    with pytest.raises(ValueError, match="one log-prob and one version per token"):
        PartialResponse([5, 6], [-1.0], [0, 0])
