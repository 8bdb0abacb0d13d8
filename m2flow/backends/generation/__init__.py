"""Generation backends: `HFGenerationBackend` (CPU or GPU, HF generate), `LeanGenerationBackend` (config name
`lean`: small Qwen2/Llama models, decoding with the functional forward) and `VLLMGenerationBackend` (CUDA, lazy)."""

from m2flow.lazy import lazy_names

# Names resolve on first use: a config checks a backend's name and traits (registry.py, factory.py)
# without importing torch or transformers through the backends.
_HOME = {
    "GenerationBackend": "base", "GenerationOptions": "base", "Response": "base", "ResponseGroup": "base",
    "SamplingParams": "base",
    "BackendTraits": "registry", "generation_backend_traits": "registry", "register_generation_backend": "registry",
    "backends_that_compile": "factory", "check_compile": "factory", "create_generation_backend": "factory",
    "generation_backend_class": "factory", "generation_backend_over": "factory",
    "HFGenerationBackend": "hf", "LeanGenerationBackend": "lean",
    "VLLMGenerationBackend": "vllm", "vllm_available": "vllm",
}
__getattr__, __dir__ = lazy_names(__name__, _HOME)

__all__ = [
    "BackendTraits",
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
    "generation_backend_traits",
    "register_generation_backend",
    "vllm_available",
]
