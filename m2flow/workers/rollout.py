"""``RolloutWorker``: n responses per prompt from a model of its own, kept current by weight sync.

The generation itself (continuous or chunked batching, seeds, fused scoring, one message per emission
and consumer rank) is
``GeneratesGroups`` (``generation.py``), shared with an actor that generates with its own policy
when the rollout is fused into it.
"""

from __future__ import annotations

import time
from typing import Any

from torch import nn

from m2flow.backends.generation import GenerationOptions, create_generation_backend
from m2flow.runtime.trace import trace_category
from m2flow.workers.common import ReasoningWorker, state_digest
from m2flow.workers.config import RolloutConfig
from m2flow.workers.generation import GeneratesGroups
from m2flow.workers.streams import GroupStream


class RolloutWorker(GeneratesGroups, ReasoningWorker):
    """Generates response groups for the prompts routed to this rank."""

    def __init__(self, model_path: str, cfg: RolloutConfig, prompts: GroupStream, responses: GroupStream,
                 *, seed: int = 0, shares_devices: bool = False, scorer: dict[str, Any] | None = None,
                 emit_each_group: bool = True) -> None:
        self.cfg = cfg
        self.seed = seed
        self.shares_devices = shares_devices
        options = GenerationOptions(device=self.torch_device, dtype=cfg.dtype, seed=seed, compile=cfg.compile)
        backend = create_generation_backend(cfg.backend, model_path, options)
        # Reward fused into this process (``GroupScorer`` keyword arguments): groups leave scored.
        self.setup_generation(backend, cfg, prompts, responses, seed=seed, scorer=scorer,
                              emit_each_group=emit_each_group)
        self._offloaded = False
        self._idle_since: float | None = None  # when the last generate call ended

    def generate(self, step: int, num_slots: int) -> dict[str, float]:
        """``GeneratesGroups.generate``, plus ``time/rollout_wait_s``: how long this rank sat idle since its
        previous iteration's generation ended (waiting for prompts, weights or the actor), its first excluded."""
        start = time.perf_counter()
        metrics = super().generate(step, num_slots)
        if self._idle_since is not None:
            metrics["time/rollout_wait_s"] = start - self._idle_since
        self._idle_since = time.perf_counter()
        return metrics

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
        """The model generated from, when it lives in this process (weights are then loaded in place)."""
        return self.backend.module

    @trace_category("weight_sync")
    def receive_weights(self, src_group: str, src_rank: int = 0, version: int | None = None) -> int:
        """Load the policy weights streamed by the actor (in place for an in-process model); ``version``
        (iterations trained) is stamped on the groups generated from them."""
        if version is not None:
            self.policy_version = version
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
