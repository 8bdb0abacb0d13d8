"""Sampling parameters, the backend registry and its factories."""

from __future__ import annotations

import re

import pytest
import torch

from m2flow.backends.generation.base import GENERATION_BACKENDS
from m2flow.backends.generation import (
    GenerationBackend,
    GenerationOptions,
    HFGenerationBackend,
    SamplingParams,
    backends_that_compile,
    create_generation_backend,
    generation_backend_class,
    generation_backend_over,
)
from m2flow.backends.generation.base import register_generation_backend


def test_sampling_params_validate():
    assert SamplingParams(stop="\n").stop == ("\n",)
    for bad in ({"n": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"max_new_tokens": 0}, {"top_k": -1}, {"stop": ("",)}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_registry_fails_loudly(ckpt):
    # Every registered backend is listed (the built-in ones, and any a test or plug-in registered).
    listed = re.escape(str(sorted(GENERATION_BACKENDS)))
    assert {"hf", "lean", "vllm"} <= set(GENERATION_BACKENDS)
    with pytest.raises(ValueError, match=rf"unknown generation backend 'tgi'; valid: {listed}"):
        create_generation_backend("tgi", str(ckpt))
    with pytest.raises(ValueError, match="already registered"):
        register_generation_backend("hf")(HFGenerationBackend)
    backend = create_generation_backend("hf", str(ckpt))
    assert isinstance(backend, HFGenerationBackend) and isinstance(backend, GenerationBackend)


def test_options_build_each_in_process_backend_with_what_it_reads(ckpt):
    from m2flow.backends.generation import LeanGenerationBackend

    hf = create_generation_backend("hf", str(ckpt), GenerationOptions(dtype="bfloat16"))
    assert type(hf) is HFGenerationBackend and hf.module.dtype == torch.bfloat16
    lean = create_generation_backend("lean", str(ckpt), GenerationOptions(compile=False))
    assert isinstance(lean, LeanGenerationBackend) and lean.decoder.compiled is None
    with pytest.raises(ValueError, match="compile is an option of the 'lean' backend, not of 'hf'"):
        create_generation_backend("hf", str(ckpt), GenerationOptions(compile=True))


def test_backends_say_whether_they_generate_in_this_process(ckpt, tok):
    assert generation_backend_class("hf").in_process and generation_backend_class("lean").in_process
    assert not generation_backend_class("vllm").in_process
    assert backends_that_compile() == ["lean"]
    model = create_generation_backend("hf", str(ckpt)).module
    over = generation_backend_over("lean", model, tok, GenerationOptions())
    assert over.module is model  # no copy: the caller's updates are what it samples from
    with pytest.raises(ValueError, match=r"'vllm' cannot generate from a model held by .*: \['hf', 'lean'"):
        generation_backend_over("vllm", model, tok, GenerationOptions())


def test_a_vllm_engine_answers_the_protocol_without_a_model_in_this_process():
    from m2flow.backends.generation import VLLMGenerationBackend

    class _Tokenizer:
        pad_token_id = None
        eos_token_id = 7

    class _Engine:  # stands in for vllm.LLM: only the tokenizer is asked for
        def get_tokenizer(self) -> _Tokenizer:
            return _Tokenizer()

    backend = VLLMGenerationBackend(_Engine())
    assert backend.module is None and not backend.in_process
    assert backend.pad_id == 7  # no padding id: the end-of-sequence id
