"""``RolloutWorker``: n responses per prompt, each finished chunk's groups sent on at once.

A rank takes the prompts routed to it, generates them in chunks of ``prompts_per_chunk`` (one device
turn each, so collocated components can run between chunks) and puts every group into the output
stream as soon as its chunk is done. Sampling is seeded by (seed, step, rank, chunk): a run, and a
run resumed from a checkpoint, draw the same responses.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from torch import nn

from m2flow.backends.generation import SamplingParams, create_generation_backend
from m2flow.data.batch import RolloutBatch
from m2flow.runtime.trace import trace_category
from m2flow.workers.common import ReasoningWorker, derive_seed, state_digest
from m2flow.workers.config import RolloutConfig, torch_dtype
from m2flow.workers.messages import GroupSample, PromptTask
from m2flow.workers.reward import GroupScorer
from m2flow.workers.stats import WEIGHT_KEY
from m2flow.workers.streams import GroupStream


def _pad_id(backend: Any) -> int:
    """The padding id of the backend's tokenizer (end-of-sequence when it has none)."""
    pad = getattr(backend, "pad_id", None)
    if pad is not None:
        return int(pad)
    llm = getattr(backend, "llm", None)
    tokenizer = llm.get_tokenizer() if llm is not None else getattr(backend, "tokenizer", None)
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if candidate is not None:
            return int(candidate)
    return 0


def sampling_params(cfg: RolloutConfig) -> SamplingParams:
    """The backend's sampling parameters for a rollout config."""
    s = cfg.sampling
    return SamplingParams(n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          max_new_tokens=s.max_new_tokens, stop=tuple(s.stop))


class RolloutWorker(ReasoningWorker):
    """Generates response groups for the prompts routed to this rank."""

    def __init__(self, model_path: str, cfg: RolloutConfig, prompts: GroupStream, responses: GroupStream,
                 *, seed: int = 0, shares_devices: bool = False, scorer: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.prompts = prompts
        self.responses = responses
        # Reward fused into this process (``GroupScorer`` keyword arguments): groups leave scored.
        self.scorer = GroupScorer(**scorer) if scorer is not None else None
        self.seed = seed
        self.shares_devices = shares_devices
        self.params = sampling_params(cfg)
        self.backend: Any = create_generation_backend(cfg.backend, model_path, **self._backend_kwargs())
        self.pad_id = _pad_id(self.backend)
        self._offloaded = False

    def _backend_kwargs(self) -> dict[str, Any]:
        if self.cfg.backend in ("hf", "lean"):
            return {"device": self.torch_device, "dtype": torch_dtype(self.cfg.dtype)}
        if self.cfg.backend == "vllm":  # the engine places itself on the visible GPU
            return {"dtype": self.cfg.dtype, "seed": self.seed}
        return {}

    # -- context switching ------------------------------------------------------------------
    def offload(self) -> None:
        self.backend.offload()
        self._offloaded = True

    def onload(self) -> None:
        if self._offloaded:  # waking an engine that never slept is not free (vLLM)
            self.backend.onload()
            self._offloaded = False

    # -- weights -----------------------------------------------------------------------------
    def _module(self) -> nn.Module | None:
        model = getattr(self.backend, "model", None)
        return model if isinstance(model, nn.Module) else None

    @trace_category("weight_sync")
    def receive_weights(self, src_group: str, src_rank: int = 0) -> int:
        """Load the policy weights streamed by the actor (in place for an in-process model)."""
        module = self._module()
        if module is not None:
            return self.receive_weights_into(module, src_group, src_rank)
        from m2flow.runtime.comm import recv_weights

        with self.tracer.span("receive_weights", cat="weight_sync"):
            weights = recv_weights(self.comm, src_group, src_rank)
            self.backend.load_weights(weights)
        return len(weights)

    def weights_digest(self) -> str:
        """Digest of the generation model's weights (see ``state_digest``)."""
        module = self._module()
        if module is None:
            raise NotImplementedError(f"backend {self.cfg.backend!r} does not expose its weights")
        return state_digest(module.state_dict())

    # -- the step ----------------------------------------------------------------------------
    @trace_category("generate")
    def generate(self, step: int, num_slots: int) -> dict[str, float]:
        """Generate the groups of this rank's prompts of iteration ``step``; returns rollout metrics."""
        tasks: list[PromptTask] = self.prompts.take(self.rank, self.prompts.expected(self.rank, num_slots))
        tasks.sort(key=lambda t: t.slot)
        if self.scorer is not None:
            self.scorer.reset()
        chunk = self.cfg.prompts_per_chunk or max(1, len(tasks))
        lengths: list[int] = []
        truncated = 0
        busy = 0.0
        starts = range(0, len(tasks), chunk)
        for k, start in enumerate(starts):
            part = tasks[start : start + chunk]
            params = replace(self.params, seed=derive_seed(self.seed, step, self.rank, k))
            with self.turn(last=k == len(starts) - 1):
                t0 = time.perf_counter()
                with self.tracer.span("generate", cat="generate", step=step, prompts=len(part)):
                    groups = self.backend.generate([t.prompt_ids for t in part], params)
                busy += time.perf_counter() - t0
            # Put after the device turn: a consumer waiting for the lock must not block a full channel.
            samples = []
            for task, group in zip(part, groups):
                batch = RolloutBatch.from_groups([group], self.pad_id, group_ids=[task.slot])
                texts = [r.text or "" for r in group.responses]
                samples.append(GroupSample(step, task.slot, task.index, task.answer, texts, batch))
                lengths.extend(len(r.token_ids) for r in group.responses)
                truncated += sum(r.finish_reason == "length" for r in group.responses)
            if self.scorer is not None:
                with self.tracer.span("reward", cat="reward", step=step, groups=len(samples)):
                    self.scorer.score(samples)
            self.responses.put_many(samples)  # the chunk's groups: one message per next-stage rank
        n = max(1, len(lengths))
        metrics = self.scorer.metrics() if self.scorer is not None else {}
        return metrics | {
            "rollout/response_length": sum(lengths) / n,
            "rollout/response_length_max": float(max(lengths, default=0)),
            "rollout/truncated_frac": truncated / n,
            "rollout/tokens_count": float(sum(lengths)),
            "rollout/responses_count": float(len(lengths)),
            "time/generate": busy,
            WEIGHT_KEY: float(len(lengths)),
        }

    @trace_category("generate")
    def evaluate(self, prompt_ids: list[list[int]], max_new_tokens: int, stop: list[str],
                 batch_size: int = 64) -> list[tuple[str, int]]:
        """Greedy responses (text, length in tokens) to ``prompt_ids`` under the current weights."""
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, stop=tuple(stop))
        out: list[tuple[str, int]] = []
        with self.turn(), self.tracer.span("evaluate", cat="generate", prompts=len(prompt_ids)):
            for start in range(0, len(prompt_ids), batch_size):
                for g in self.backend.generate(prompt_ids[start : start + batch_size], params):
                    out.append((g.responses[0].text or "", len(g.responses[0].token_ids)))
        return out
