"""Generation backends: `HFGenerationBackend` (CPU or GPU, HF generate), `LeanGenerationBackend` (small
Qwen2/Llama models, a lean decoding loop) and `VLLMGenerationBackend` (CUDA, lazy)."""

from m2flow.backends.generation.base import (
    GenerationBackend,
    Response,
    ResponseGroup,
    SamplingParams,
    IN_PROCESS_BACKENDS,
    create_generation_backend,
    generation_backend_over,
    register_generation_backend,
)
from m2flow.backends.generation.hf import HFGenerationBackend
from m2flow.backends.generation.lean import LeanGenerationBackend
from m2flow.backends.generation.vllm import VLLMGenerationBackend, vllm_available

__all__ = [
    "IN_PROCESS_BACKENDS",
    "GenerationBackend",
    "HFGenerationBackend",
    "LeanGenerationBackend",
    "Response",
    "ResponseGroup",
    "SamplingParams",
    "VLLMGenerationBackend",
    "create_generation_backend",
    "generation_backend_over",
    "register_generation_backend",
    "vllm_available",
]
