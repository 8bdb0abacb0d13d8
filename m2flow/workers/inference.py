"""``InferenceWorker``: behaviour (old-policy) and reference log-probs, in micro-batches of what is ready.

It holds a copy of the policy, refreshed by weight sync each iteration (when ``old_logprobs`` is
``"inference"``), and the frozen reference model (when a KL term needs it). It blocks for the first
group, then takes whatever else is queued up to ``micro_batch_size`` responses (or
``micro_batch_tokens`` tokens): early in an
iteration micro-batches are small and latency is low, later they grow and throughput is high.
With nothing to compute it only passes groups on, so the workflow is the same for every algorithm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from m2flow.models.causal_lm import load_causal_lm, response_logprobs
from m2flow.models.response_forward import create_response_forward
from m2flow.runtime.trace import trace_category
from m2flow.workers.common import ReasoningWorker, state_digest
from m2flow.workers.config import AlgorithmConfig, InferenceConfig, torch_dtype
from m2flow.workers.messages import GroupSample, group_tokens, join_groups, scatter_rows
from m2flow.workers.stats import WEIGHT_KEY
from m2flow.runtime.streams import GroupStream


@dataclass(frozen=True, kw_only=True)
class InferenceSettings:
    """Inference: the log-probs it adds, in the plan's micro-batches, between two streams."""

    model_path: str
    inference: InferenceConfig
    """dtype and forward (its micro-batch keys are the plan's, below)"""
    algo: AlgorithmConfig
    temperature: float
    group_size: int
    scored: GroupStream
    ready: GroupStream
    micro_batch_size: int = 32
    micro_batch_tokens: int | None = None
    shares_devices: bool = False
    offload: bool = False


class InferenceWorker(ReasoningWorker):
    """Adds ``old_logprobs`` and ``ref_logprobs`` to the groups routed to this rank."""

    def __init__(self, *, settings: InferenceSettings) -> None:
        s = settings
        cfg, algo, model_path = s.inference, s.algo, s.model_path
        self.cfg = cfg
        self.inp: GroupStream = s.scored
        self.out: GroupStream = s.ready
        self.shares_devices, self.offloads = s.shares_devices, s.offload
        self.temperature = s.temperature if s.temperature > 0 else 1.0
        self.micro_batch_tokens = s.micro_batch_tokens
        self.groups_per_batch = max(1, s.micro_batch_size // s.group_size)
        dtype = torch_dtype(cfg.dtype)
        self.policy: nn.Module | None = None
        self.reference: nn.Module | None = None
        if algo.old_logprobs == "inference":
            self.policy = load_causal_lm(model_path, dtype=dtype, device=self.torch_device)
        if algo.needs_reference:
            self.reference = load_causal_lm(model_path, dtype=dtype, device=self.torch_device)
        self.forward = create_response_forward(cfg.forward)
        """The forward the log-probs are computed with (``inference.forward``)."""
        for model in self._models():  # an unsupported model fails here, not in the first iteration
            self.forward.check(model)

    # -- context switching ------------------------------------------------------------------
    def _models(self) -> list[nn.Module]:
        return [m for m in (self.policy, self.reference) if m is not None]

    def offload(self) -> None:
        if self.torch_device.type != "cpu":
            for m in self._models():
                m.to("cpu")
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if self.torch_device.type != "cpu":
            for m in self._models():
                m.to(self.torch_device)

    # -- weights -----------------------------------------------------------------------------
    def wants_weights(self) -> bool:
        """True when this worker holds a policy copy that weight sync must refresh."""
        return self.policy is not None

    @trace_category("weight_sync")
    def receive_weights(self, src_group: str, src_rank: int = 0) -> int:
        if self.policy is None:
            raise RuntimeError("this inference worker holds no policy copy (old_logprobs is not 'inference')")
        return self.receive_weights_into(self.policy, src_group, src_rank)

    def weights_digest(self) -> str:
        if self.policy is None:
            raise RuntimeError("this inference worker holds no policy copy")
        return state_digest(self.policy.state_dict())

    # -- the step ----------------------------------------------------------------------------
    @trace_category("logprobs")
    def compute(self, step: int, num_slots: int) -> dict[str, float]:
        """Log-probs for this rank's groups of iteration ``step``; returns inference metrics."""
        remaining = self.inp.expected(self.rank, num_slots)
        busy = 0.0
        sizes: list[int] = []
        while remaining:
            groups: list[GroupSample] = self._take_micro_batch(remaining, step)
            remaining -= len(groups)
            live = [g for g in groups if not g.dropped]
            if live and self._models():
                t0 = time.perf_counter()
                span = self.tracer.span("logprobs", cat="logprobs", step=step, groups=len(live))
                with self.turn(last=remaining == 0), span:
                    self._logprobs(live)
                busy += time.perf_counter() - t0
                sizes.append(sum(g.size for g in live))
            self.out.put_many(groups)
        return {
            "perf/inference_micro_batch": sum(sizes) / max(1, len(sizes)),
            "time/inference": busy,
            WEIGHT_KEY: float(max(1, len(sizes))),
        }

    def _take_micro_batch(self, remaining: int, step: int) -> list[GroupSample]:
        """What is ready of iteration ``step``, up to ``micro_batch_tokens`` tokens when set, else
        ``micro_batch_size`` responses."""
        if self.micro_batch_tokens is not None:
            return self.inp.take_tokens(self.rank, remaining, self.micro_batch_tokens, group_tokens, step=step)
        return self.inp.take_ready(self.rank, min(self.groups_per_batch, remaining), step)

    @torch.no_grad()
    def _logprobs(self, groups: list[GroupSample]) -> None:
        batch = join_groups(groups).to(self.torch_device)
        args = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
        for model, field in ((self.policy, "old_logprobs"), (self.reference, "ref_logprobs")):
            if model is not None:
                logp, _ = response_logprobs(model, *args, temperature=self.temperature, forward=self.forward)
                scatter_rows(groups, field, logp.float().cpu())
