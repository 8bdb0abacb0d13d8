"""Generation with Hugging Face `generate`: batched, left-padded, KV cache, stop strings, per-token log-probs.

Log-probs: each sampled token's log-prob is taken from `log_softmax(logits / temperature)` of the raw
model logits, i.e. the policy at the sampling temperature *before* top-k / top-p truncation (for
greedy decoding, temperature 0, the temperature-1 policy). That is exactly what
`m2flow.models.causal_lm.response_logprobs(..., temperature=T)` recomputes for the same tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel, StoppingCriteria, StoppingCriteriaList

from m2flow.backends.generation.base import (
    GenerationOptions,
    SamplingParams,
    register_generation_backend,
    text_before_stop,
)
from m2flow.data.batch import FinishReason, Response, ResponseGroup, left_pad
from m2flow.models.rng import seeded

logger = logging.getLogger(__name__)


class _LogprobRecorder(LogitsProcessor):
    """Sees the raw logits of each step first and keeps the log-prob of the token sampled from them."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self._last: torch.Tensor | None = None  # (B, V) log-probs of the latest step
        self.picked: list[torch.Tensor] = []  # one (B,) tensor per generated token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        # The token sampled from the previous step's distribution is now the last input id.
        self._gather(input_ids[:, -1])
        self._last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _gather(self, tokens: torch.Tensor) -> None:
        if self._last is not None:
            self.picked.append(self._last.gather(-1, tokens[:, None]).squeeze(-1))
            self._last = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """(B, T) log-probs of all generated tokens, once generation has returned `sequences`."""
        self._gather(sequences[:, -1])
        return torch.stack(self.picked, dim=1)


class _StopStrings(StoppingCriteria):
    """Ends a row when its generated text contains a stop string; records how many tokens that took."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_len: int, batch: int) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.prompt_len = prompt_len
        # A stop string of c characters is completed within the last c tokens, unless tokens decode to
        # less than a character (byte pieces of one UTF-8 character: at most 4 per character).
        self.tail = 4 * max(len(s) for s in stops) + 4
        self.stopped_at = [0] * batch  # generated-token count when the stop string completed; 0 = not yet

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids[:, self.prompt_len :]
        texts = self.tokenizer.batch_decode(generated[:, -self.tail :], skip_special_tokens=True)
        done = torch.zeros(len(texts), dtype=torch.bool, device=input_ids.device)
        for row, text in enumerate(texts):
            if self.stopped_at[row]:
                done[row] = True
            elif any(s in text for s in self.stops):
                self.stopped_at[row] = generated.shape[1]
                done[row] = True
        return done


def _chunk_seed(seed: int, chunk: int) -> int:
    """A distinct, reproducible seed for each chunk of one call."""
    return int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0])


@register_generation_backend("hf")
class HFGenerationBackend:
    """A `GenerationBackend` over a Hugging Face causal LM held in this process."""

    # in_process, compiles, continuous: declared in registry.py (read before this module is imported)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any,
        device: str | torch.device = "cpu",
        prompts_per_chunk: int | None = None,
    ) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.prompts_per_chunk = prompts_per_chunk
        """Default number of prompts per `generate` call in `generate_iter` (None: all at once)."""
        self.offloaded = False
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        if not eos_ids:
            raise ValueError("the tokenizer or generation config must define an end-of-sequence token")
        self.eos_ids = sorted(eos_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        prompts_per_chunk: int | None = None,
        **options: Any,
    ) -> HFGenerationBackend:
        """Load model and tokenizer from one local directory; `options` go to the class (e.g. the lean
        backend's `compile`)."""
        from m2flow.models.causal_lm import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(path, dtype=dtype, device=device)
        return cls(model, tokenizer, device=device, prompts_per_chunk=prompts_per_chunk, **options)

    @classmethod
    def from_options(cls, path: str | Path, options: GenerationOptions) -> HFGenerationBackend:
        """`from_pretrained` with the device and dtype of `options` (and what the class itself reads)."""
        return cls.from_pretrained(path, device=options.device, dtype=options.torch_dtype, **cls._own_options(options))

    @classmethod
    def over_model(cls, model: PreTrainedModel, tokenizer: Any, options: GenerationOptions) -> HFGenerationBackend:
        """A backend generating from `model` itself, on `options.device`."""
        return cls(model, tokenizer, device=options.device, **cls._own_options(options))

    @classmethod
    def _own_options(cls, options: GenerationOptions) -> dict[str, Any]:
        """Constructor arguments of this class beyond the model, tokenizer and device."""
        return {}

    @property
    def module(self) -> nn.Module:
        """The model generated from (in this process)."""
        return self.model

    # ---- generation -------------------------------------------------------------------------

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[ResponseGroup]:
        """One group of `params.n` responses per prompt, in prompt order (chunked as `prompts_per_chunk`)."""
        return list(self.generate_iter(prompt_ids, params))

    def generate_iter(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        prompts_per_chunk: int | None = None,
    ) -> Iterator[ResponseGroup]:
        """Generate chunk by chunk, yielding each chunk's groups (in prompt order) as soon as it is done.

        Chunk k is sampled with a seed derived from (params.seed, k), so results depend on the seed
        and on the chunk size, and on nothing else.
        """
        if self.offloaded:
            raise RuntimeError("generation backend is offloaded; call onload() first")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        size = prompts_per_chunk or self.prompts_per_chunk or len(prompt_ids) or 1
        for k, start in enumerate(range(0, len(prompt_ids), size)):
            chunk = prompt_ids[start : start + size]
            seed = None if params.seed is None else _chunk_seed(params.seed, k)
            yield from self._generate_chunk(chunk, params, start, seed)

    @torch.no_grad()
    def _generate_chunk(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, first_index: int, seed: int | None
    ) -> list[ResponseGroup]:
        n = params.n
        ids, mask = left_pad(prompts, self.pad_id)
        # Rows are prompt-major: row p * n + j is response j of prompt p.
        ids = ids.repeat_interleave(n, dim=0).to(self.device)
        mask = mask.repeat_interleave(n, dim=0).to(self.device)
        prompt_len = ids.shape[1]
        recorder = _LogprobRecorder(params.temperature)
        criteria = StoppingCriteriaList()
        stopper = None
        if params.stop:
            stopper = _StopStrings(self.tokenizer, params.stop, prompt_len, ids.shape[0])
            criteria.append(stopper)
        greedy = params.temperature == 0
        kwargs: dict[str, Any] = dict(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=0,
            do_sample=not greedy,
            # Every sampling knob is set explicitly: unset ones would be filled from the checkpoint's
            # generation_config.json (e.g. a repetition penalty), changing both sampling and log-probs.
            temperature=1.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            logits_processor=LogitsProcessorList([recorder]),
            stopping_criteria=criteria,
            use_cache=True,
        )
        # generate draws from torch's global generator: alone on it, for ranks sharing a process.
        with seeded(seed, [] if self.device.type == "cpu" else [self.device]):
            sequences = self.model.generate(**kwargs)
        generated = sequences[:, prompt_len:].cpu()
        logprobs = recorder.finish(sequences).cpu()
        stopped_at = stopper.stopped_at if stopper is not None else None
        return self._groups(prompts, first_index, params, generated, logprobs, stopped_at)

    def _groups(
        self,
        prompts: Sequence[Sequence[int]],
        first_index: int,
        params: SamplingParams,
        generated: torch.Tensor,
        logprobs: torch.Tensor,
        stopped_at: Sequence[int] | None,
    ) -> list[ResponseGroup]:
        """Groups from prompt-major rows: generated ids and their log-probs (B, T), and per row the token
        count at which a stop string completed (0: never; None: no stop strings)."""
        n = params.n
        groups: list[ResponseGroup] = []
        for p, prompt in enumerate(prompts):
            responses = []
            for row in range(p * n, (p + 1) * n):
                stop_len = stopped_at[row] if stopped_at is not None else 0
                responses.append(self._cut(generated[row], logprobs[row], stop_len, params.stop))
            groups.append(ResponseGroup(prompt_index=first_index + p, prompt_ids=list(prompt), responses=responses))
        return groups

    def _cut(self, tokens: torch.Tensor, logprobs: torch.Tensor, stop_len: int, stops: Sequence[str]) -> Response:
        """Cut one row after its end-of-sequence token or the token completing a stop string."""
        end, reason = len(tokens), "length"
        eos_hits = torch.isin(tokens, torch.tensor(self.eos_ids)).nonzero()
        if len(eos_hits):
            end, reason = int(eos_hits[0]) + 1, "stop"
        if stop_len and stop_len <= end:
            end, reason = stop_len, "stop"
        finish: FinishReason = reason  # type: ignore[assignment]
        kept = tokens[:end].tolist()
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return Response(token_ids=kept, logprobs=logprobs[:end].tolist(), finish_reason=finish,
                        text=text_before_stop(text, stops))

    # ---- weights and memory -----------------------------------------------------------------

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy the given parameters in place by name; unknown names raise, missing ones are kept."""
        own = self.model.state_dict()
        unknown = [k for k in state_dict if k not in own]
        if unknown:
            raise KeyError(f"unknown parameter name(s) for this model: {unknown[:5]}")
        with torch.no_grad():
            for name, value in state_dict.items():
                own[name].copy_(value)

    def offload(self) -> None:
        """Move the weights to host memory (a no-op for a CPU model beyond marking it unavailable)."""
        if self.device.type != "cpu":
            self.model.to("cpu")
            torch.cuda.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        """Move the weights back to the generation device."""
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.offloaded = False
