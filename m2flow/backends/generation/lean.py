"""The `lean` backend: generation with the functional Qwen2/Llama forward (`m2flow.models.functional_lm`),
HF's results at less cost per token.

For models of a few layers and ~100 wide on a CPU, HF `generate` spends most of each step in Python
(module calls, cache objects, logits processors) rather than in arithmetic. This backend keeps all of
`HFGenerationBackend` that defines the results (chunking and per-chunk seeds, prompt-major rows,
sampling knobs, log-probs, stop strings, cutting, weight loading) and replaces only the decoding loop:
one prefill, then one `FunctionalLM.decode` per token over fused weights and a preallocated KV cache.

It decides tokens as HF does: greedy takes the argmax of the raw logits; sampling applies temperature,
then top-k, then top-p, and draws with one `torch.multinomial` over the whole batch per step. Rows
that ended leave the forward but still take part in that draw, so the random stream is consumed as
by HF and the same seed gives HF's samples whenever the logits agree (they match to float rounding).

`generate_stream` is continuous batching over the same decoder (`continuous.py`): a running batch of
at most `max_running` rows, each group handed out when its last row ends, with per-prompt seeds.

Limits: only what `FunctionalLM` supports (Qwen2/Llama, default RoPE, full attention, SiLU); one process and
one device; no speculative or beam decoding. The fused copies of the q/k/v and gate/up weights take
about two thirds of the layers' memory again; they are rebuilt after `load_weights`, and after any
in-place update of `model`'s parameters, which the next `generate` notices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from m2flow.backends.generation.base import GenerationOptions, SamplingParams, register_generation_backend
from m2flow.backends.generation.continuous import stream_groups
from m2flow.backends.generation.inflight import InFlight
from m2flow.backends.generation.sampling import warp_logits
from m2flow.backends.generation.hf import HFGenerationBackend, _StopStrings
from m2flow.data.batch import ResponseGroup, left_pad
from m2flow.models.functional_lm import FunctionalLM, KVPrefix, check_supported


@register_generation_backend("lean")
class LeanGenerationBackend(HFGenerationBackend):
    """A `GenerationBackend` over a Qwen2/Llama HF model, decoding with `FunctionalLM` (ValueError for others)."""

    # compiles, continuous (and in_process): declared in registry.py (read before this module is imported)

    drop_finished: bool = True
    """Take rows that ended (end-of-sequence token or stop string) out of the decoding batch. It copies the
    KV cache each time, yet saved ~7% of the time on the G1 shape (8 prompts x 4 samples x 16 tokens)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Any,
        device: str | torch.device = "cpu",
        prompts_per_chunk: int | None = None,
        compile: bool = False,
    ) -> None:
        check_supported(model.config)
        super().__init__(model, tokenizer, device=device, prompts_per_chunk=prompts_per_chunk)
        self.decoder = FunctionalLM.from_hf(self.model, compile=compile)
        """The decoder; with `compile` its decoding steps run `torch.compile`d (`m2flow.models.functional_decode`)."""

    @classmethod
    def _own_options(cls, options: GenerationOptions) -> dict[str, Any]:
        return {"compile": options.compile}

    @torch.no_grad()
    def _generate_chunk(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, first_index: int, seed: int | None
    ) -> list[ResponseGroup]:
        ids, mask = left_pad(prompts, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        # A generator of the chunk's own, not torch's global one: ranks that share a process (the local
        # executor) must not draw from each other's stream. Seeded alike, it draws the same numbers.
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed)
        generated, logprobs, stopped_at = self._decode(ids, mask, params, generator)
        return self._groups(prompts, first_index, params, generated.cpu(), logprobs.cpu(), stopped_at)

    def _decode(
        self, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[int] | None]:
        """For left-padded prompts (P, Lp): generated ids (B, T) (pad after a row ends), their log-probs
        (B, T) and stop-string lengths per row, B = P * n rows, prompt-major (row p * n + j: sample j of p)."""
        b, steps = ids.shape[0] * params.n, params.max_new_tokens
        greedy = params.temperature == 0
        # The recorded policy is the sampling temperature's, before truncation (greedy: temperature 1).
        temperature = 1.0 if greedy else params.temperature
        generated = torch.full((b, steps), self.pad_id, dtype=torch.long, device=ids.device)
        logprobs = torch.zeros(b, steps, device=ids.device)
        eos = torch.tensor(self.eos_ids, device=ids.device)
        pad = torch.tensor(self.pad_id, device=ids.device)
        running = torch.ones(b, dtype=torch.bool, device=ids.device)
        stopper = _StopStrings(self.tokenizer, params.stop, 0, b) if params.stop else None
        logits, state = self.decoder.prefill(ids, mask, steps, repeats=params.n)
        held: torch.Tensor | None = None  # the rows still in the decoding batch (None: all of them)
        for t in range(steps):
            if held is None:
                scores = logits.float()
            else:
                # Rows that ended keep their last scores: their draws are discarded, but sampling over
                # the full batch draws the random numbers exactly as HF does for the rows still going.
                scores[held] = logits.float()
            if greedy:
                token = scores.argmax(-1)
            else:
                token = torch.multinomial(torch.softmax(warp_logits(scores, params), dim=-1), 1,
                                          generator=generator).squeeze(1)
            # As HF: a row that has ended gets the padding id.
            token = torch.where(running, token, pad)
            generated[:, t] = token
            policy = torch.log_softmax(scores / temperature if temperature != 1.0 else scores, dim=-1)
            logprobs[:, t] = policy.gather(-1, token[:, None]).squeeze(-1)
            running &= ~torch.isin(token, eos)
            if stopper is not None:
                running &= ~stopper(generated[:, : t + 1], scores)
            if t == steps - 1 or not running.any():
                break
            going = running if held is None else running[held]
            if self.drop_finished and not going.all():
                keep = going.nonzero().squeeze(1)
                state.select(keep)
                held = keep if held is None else held[keep]
            logits = self.decoder.decode(token if held is None else token[held], state)
        return generated, logprobs, (stopper.stopped_at if stopper is not None else None)

    @torch.no_grad()
    def generate_stream(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int],
                        max_running: int, prefixes: Sequence[KVPrefix | None] | None = None,
                        keep: dict[int, KVPrefix] | None = None, flight: InFlight | None = None,
                        ) -> Iterator[list[ResponseGroup]]:
        """Continuous batching (`m2flow.backends.generation.continuous`): at most `max_running` rows decode
        at once; each prompt's group is yielded as soon as all its rows ended, in batches of the groups
        that ended at the same token; prompt p samples from a generator seeded with `seeds[p]`. With
        `prefixes` a prompt runs on from the cached keys and values of the tokens it begins with; `keep`
        collects each row's cache as it ends; `flight`: weight updates between decoding steps, rows begun
        earlier, rows left unfinished when the stream is closed (see `stream_groups`, `inflight.py`)."""
        if self.offloaded:
            raise RuntimeError("generation backend is offloaded; call onload() first")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        yield from stream_groups(self, prompt_ids, params, seeds, max_running, prefixes, keep, flight)

    # ---- weights and memory -----------------------------------------------------------------

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy the given parameters in place by name (unknown names raise), then rebuild the fused weights."""
        super().load_weights(state_dict)
        self.decoder.refresh()

    def offload(self) -> None:
        """Drop the fused weights and move the model to host memory (on a CPU: only mark it unavailable)."""
        if self.device.type != "cpu":
            self.decoder.release()
        super().offload()

    def onload(self) -> None:
        """Move the weights back; the fused weights are rebuilt by the next `generate`."""
        super().onload()
