"""Generation backends: `HFGenerationBackend` (CPU or GPU, HF generate), `LeanGenerationBackend` (config name
`lean`: small Qwen2/Llama models, decoding with the functional forward) and `VLLMGenerationBackend` (CUDA, lazy)."""

from m2flow.backends.generation.base import (
    GenerationBackend,
    GenerationOptions,
    Response,
    ResponseGroup,
    SamplingParams,
    register_generation_backend,
)
from m2flow.backends.generation.factory import (
    backends_that_compile,
    check_compile,
    create_generation_backend,
    generation_backend_class,
    generation_backend_over,
)
from m2flow.backends.generation.hf import HFGenerationBackend
from m2flow.backends.generation.lean import LeanGenerationBackend
from m2flow.backends.generation.vllm import VLLMGenerationBackend, vllm_available

__all__ = [
    "GenerationBackend",
    "GenerationOptions",
    "HFGenerationBackend",
    "LeanGenerationBackend",
    "Response",
    "ResponseGroup",
    "SamplingParams",
    "VLLMGenerationBackend",
    "backends_that_compile",
    "check_compile",
    "create_generation_backend",
    "generation_backend_class",
    "generation_backend_over",
    "register_generation_backend",
    "vllm_available",
]
