"""The whole-cache decoding step (`functional_decode`): eager and compiled, against `FunctionalLM`'s own decoding."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters

from m2flow.models.functional_lm import FunctionalLM
from tests.models.test_functional_lm import MODELS, _batch, _model

torch.set_num_threads(1)


def _decode_run(functional: FunctionalLM, ids: torch.Tensor, mask: torch.Tensor, steps: int = 6) -> list[torch.Tensor]:
    """Greedy decoding of 2 left-padded prompts x 3 copies: all 6 rows, then rows 0, 2, 3 and 5, then row 3
    alone (one row runs eagerly in the compiled step too)."""
    outputs = []
    logits, state = functional.prefill(ids[:2], mask[:2], max_new_tokens=steps + 1, repeats=3)
    token = logits.argmax(-1)
    for t in range(steps):
        if t == 2:
            keep = torch.tensor([0, 2, 3, 5])
            state.select(keep)
            token = token[keep]
        if t == 4:
            state.select(torch.tensor([2]))
            token = token[2:3]
        logits = functional.decode(token, state)
        outputs.append(logits)
        token = logits.argmax(-1)
    return outputs


def _assert_same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_whole_cache_step_decodes_as_the_filled_slots_forward(name):
    model = _model(**MODELS[name])
    ids, mask = _batch(seed=5)
    whole = FunctionalLM.from_hf(model, compile=True)
    whole.compiled._compiled = None  # decode_step itself, uncompiled
    _assert_same(_decode_run(whole, ids, mask), _decode_run(FunctionalLM.from_hf(model), ids, mask))


def test_compiled_step_decodes_as_the_eager_one():
    model = _model()  # grouped-query attention, tied head
    ids, mask = _batch(seed=6)
    functional = FunctionalLM.from_hf(model, compile=True)
    captured, graphs = counters["stats"]["calls_captured"], counters["stats"]["unique_graphs"]
    got = _decode_run(functional, ids, mask)
    assert functional.compiled.active and functional.compiled.failure is None
    assert counters["stats"]["calls_captured"] > captured  # it did compile
    assert counters["stats"]["unique_graphs"] == graphs + 1  # once, for both batch sizes
    _assert_same(got, _decode_run(FunctionalLM.from_hf(model), ids, mask))
    # Changed weights are read on the next batch without compiling again.
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(1.5)
    captured = counters["stats"]["calls_captured"]
    _assert_same(_decode_run(functional, ids, mask), _decode_run(FunctionalLM.from_hf(model), ids, mask))
    assert counters["stats"]["calls_captured"] == captured


def test_a_failing_compile_falls_back_to_eager_decoding(caplog):
    model = _model(arch="llama")
    ids, mask = _batch(seed=7)
    functional = FunctionalLM.from_hf(model, compile=True)

    def broken(*args):
        raise RuntimeError("no C++ compiler found\nmore detail")

    functional.compiled._compiled = broken
    with caplog.at_level(logging.WARNING, logger="m2flow.models.functional_decode"):
        got = _decode_run(functional, ids, mask)
    assert not functional.compiled.active
    assert functional.compiled.failure == "RuntimeError: no C++ compiler found"
    assert "decoding eagerly" in caplog.text
    _assert_same(got, _decode_run(FunctionalLM.from_hf(model), ids, mask))
