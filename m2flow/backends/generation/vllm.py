"""Generation with vLLM's offline `LLM` engine on CUDA machines; vLLM is imported only when used.

Log-probs: vLLM reports each sampled token's log-prob under its raw logits (temperature 1, before
top-k / top-p), so they equal the HF backend's only when sampling at temperature 1; trainers that
sample at another temperature should recompute old log-probs (which the inference step does anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from m2flow.backends.generation.base import GenerationOptions, SamplingParams, register_generation_backend
from m2flow.data.batch import Response, ResponseGroup

logger = logging.getLogger(__name__)


def vllm_available() -> bool:
    """True when vLLM can be imported and a CUDA device is present."""
    if not torch.cuda.is_available():
        return False
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


@register_generation_backend("vllm")
class VLLMGenerationBackend:
    """A `GenerationBackend` over `vllm.LLM` (one engine in this process)."""

    # in_process (no: the engine holds its own copy of the weights), compiles, continuous (no: LLM.generate
    # returns a call's requests together, see the user guide): declared in registry.py

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.asleep: set[str] = set()
        """What sleeps: {"weights", "kv_cache"} after ``offload``, {"kv_cache"} once new weights went in."""

    @classmethod
    def from_options(cls, path: str | Path, options: GenerationOptions) -> VLLMGenerationBackend:
        """`from_pretrained` with the dtype and seed of `options` (the engine places itself on the visible GPU)."""
        return cls.from_pretrained(path, dtype=options.dtype, seed=options.seed)

    @property
    def module(self) -> None:
        """None: the weights live in the engine, loaded through `load_weights`."""
        return None

    @property
    def pad_id(self) -> int:
        """The tokenizer's padding id (its end-of-sequence id when it has none; 0 when it has neither)."""
        tokenizer = self.llm.get_tokenizer()
        for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
            if candidate is not None:
                return int(candidate)
        return 0

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.5,
        enable_sleep_mode: bool = True,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> VLLMGenerationBackend:
        """Start an engine on the local model directory `path` (tokenizer from the same directory)."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"model directory not found: {path}")
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("the 'vllm' generation backend needs the vllm package (a CUDA machine)") from e
        llm = LLM(
            model=str(path),
            tokenizer=str(path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            seed=seed,
            **llm_kwargs,
        )
        return cls(llm)

    @staticmethod
    def _sampling_params(params: SamplingParams, chunk: int) -> Any:
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            # Distinct per chunk, reproducible per call, like the HF backend.
            seed=None if params.seed is None else params.seed * 1_000_003 + chunk,
            logprobs=0,  # 0 extra candidates: only the sampled token's log-prob
        )

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[ResponseGroup]:
        """One group of `params.n` responses per prompt, in prompt order."""
        return list(self.generate_iter(prompt_ids, params))

    def generate_iter(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        prompts_per_chunk: int | None = None,
    ) -> Iterator[ResponseGroup]:
        """Yield each chunk's groups as soon as the engine returns them."""
        if self.asleep:
            raise RuntimeError(f"generation backend is offloaded ({', '.join(sorted(self.asleep))} asleep); "
                               "call onload() first")
        size = prompts_per_chunk or len(prompt_ids) or 1
        for k, start in enumerate(range(0, len(prompt_ids), size)):
            chunk = prompt_ids[start : start + size]
            prompts = [{"prompt_token_ids": list(p)} for p in chunk]
            outputs = self.llm.generate(prompts, self._sampling_params(params, k), use_tqdm=False)
            for i, out in enumerate(outputs):
                responses = []
                for c in out.outputs:
                    token_ids = list(c.token_ids)
                    logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, c.logprobs or [])]
                    responses.append(
                        Response(
                            token_ids=token_ids,
                            logprobs=logprobs,
                            finish_reason="length" if c.finish_reason == "length" else "stop",
                            text=c.text,
                        )
                    )
                yield ResponseGroup(prompt_index=start + i, prompt_ids=list(chunk[i]), responses=responses)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Hand the named tensors to the engine's model (`model.load_weights`, HF parameter names).

        A sleeping engine has no device memory behind its weights: what is written there is lost, and
        waking up copies the old weights back from host memory. So the weights wake first, alone
        (``wake_up(tags=["weights"])``, the KV cache stays released until ``onload``), then load.
        """
        if "weights" in self.asleep:
            self._wake(["weights"])
        items = list(state_dict.items())
        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda model: model.load_weights(items))
        else:
            engine = self.llm.llm_engine
            engine.model_executor.driver_worker.model_runner.model.load_weights(items)

    def offload(self) -> None:
        """Sleep level 1: weights to host memory, KV cache freed."""
        if self.asleep == {"weights", "kv_cache"}:
            return
        if self.asleep:  # half awake (new weights, no KV cache): sleep from fully awake
            self._wake(sorted(self.asleep))
        self.llm.sleep(level=1)
        self.asleep = {"weights", "kv_cache"}

    def onload(self) -> None:
        """Wake what still sleeps: the weights (unless new ones were loaded since) and the KV cache."""
        if self.asleep:
            self._wake(sorted(self.asleep))

    def _wake(self, tags: list[str]) -> None:
        if set(tags) == {"weights", "kv_cache"}:
            self.llm.wake_up()
            self.asleep.clear()
            return
        try:
            self.llm.wake_up(tags=tags)
        except TypeError:  # a vLLM without tags wakes everything at once
            self.llm.wake_up()
            self.asleep.clear()
            return
        self.asleep.difference_update(tags)
