"""Sampling parameters and the backend registry."""

from __future__ import annotations

import pytest

from m2flow.backends.generation import GenerationBackend, HFGenerationBackend, SamplingParams, create_generation_backend
from m2flow.backends.generation.base import register_generation_backend


def test_sampling_params_validate():
    assert SamplingParams(stop="\n").stop == ("\n",)
    for bad in ({"n": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"max_new_tokens": 0}, {"top_k": -1}, {"stop": ("",)}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_registry_fails_loudly(ckpt):
    with pytest.raises(ValueError, match=r"unknown generation backend 'tgi'; valid: \['hf', 'lean', 'vllm'\]"):
        create_generation_backend("tgi", str(ckpt))
    with pytest.raises(ValueError, match="already registered"):
        register_generation_backend("hf")(HFGenerationBackend)
    backend = create_generation_backend("hf", str(ckpt))
    assert isinstance(backend, HFGenerationBackend) and isinstance(backend, GenerationBackend)
