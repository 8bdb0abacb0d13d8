"""``RolloutWorker``: n responses per prompt from a model of its own, kept current by weight sync.

The generation itself (continuous or chunked batching, seeds, fused scoring, one message per emission
and consumer rank) is ``Generation`` (``generation.py``), which an actor hosts over the policy it trains
when the rollout is fused into it. The reward, when fused here, is hosted by this worker: groups leave
it scored.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from m2flow.backends.generation import GenerationOptions, create_generation_backend
from m2flow.runtime.trace import trace_category
from m2flow.workers.common import ReasoningWorker
from m2flow.workers.generation import Generation, RolloutSettings


class RolloutWorker(ReasoningWorker):
    """Generates response groups for the prompts routed to this rank."""

    def __init__(self, *, settings: RolloutSettings, hosted: Mapping[str, Any] | None = None) -> None:
        self.seed = settings.seed
        self.shares_devices, self.offloads = settings.shares_devices, settings.offload
        self.policy_version = 0
        """The version of the weights generated from (iterations trained); stamped on every group."""
        options = GenerationOptions(device=self.torch_device, dtype=settings.dtype, seed=self.seed,
                                    compile=settings.compile)
        self.backend = create_generation_backend(settings.backend, settings.model_path, options)
        self.host_components(hosted)  # the reward, when the plan fuses it here
        self._weights_from: tuple[str, int] | None = None  # (group, rank) weights come from, once one came
        self._loaded: int | None = None  # the version of the last weight stream loaded, when it said
        self.generation = Generation(self, self.backend, settings, scorer=self.hosted("reward"),
                                     poll_weights=self.poll_weights if settings.inflight_updates else None)
        self._offloaded = False
        self._idle_since: float | None = None  # when the last generate call ended

    @trace_category("generate")
    def generate(self, step: int, num_slots: int, owed_slots: int | None = None) -> dict[str, float]:
        """``Generation.generate``, plus ``time/rollout_wait_s``: how long this rank sat idle since its
        previous iteration's generation ended (waiting for prompts, weights or the actor), its first excluded."""
        start = time.perf_counter()
        metrics = self.generation.generate(step, num_slots, owed_slots)
        if self._idle_since is not None:
            metrics["time/rollout_wait_s"] = start - self._idle_since
        self._idle_since = time.perf_counter()
        return metrics

    @trace_category("generate")
    def evaluate(self, prompt_ids: list[list[int]], max_new_tokens: int, stop: list[str],
                 batch_size: int = 64) -> list[tuple[str, int]]:
        """``Generation.evaluate``: greedy responses under the current weights."""
        return self.generation.evaluate(prompt_ids, max_new_tokens, stop, batch_size)

    def partial_state(self) -> list[dict[str, Any]]:
        """``Generation.partial_state``: the carried prompts and their rows, as a checkpoint holds them."""
        return self.generation.partial_state()

    def restore_partial(self, state: list[dict[str, Any]]) -> None:
        """``Generation.restore_partial``: carry what a checkpoint held into the next step."""
        self.generation.restore_partial(state)

    def carried_prompts(self) -> list[int]:
        """The dataset indices of the prompts partial rollouts carry into the next step."""
        return [t.index for t in self.generation.carried_prompts()]

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
        (iterations trained) is stamped on the groups generated from them. With in-flight updates the stream of
        ``version`` may have been loaded already, between decoding steps of the generation queued before this
        call (``poll_weights``): then there is nothing left to receive."""
        self._weights_from = (src_group, src_rank)
        if version is not None and self._loaded is not None and version <= self._loaded:
            return 0
        sent, count = self._receive(src_group, src_rank)
        if version is not None and sent is not None and sent != version:
            raise RuntimeError(f"expected the weights of version {version} from {src_group}[{src_rank}], "
                               f"received version {sent}")
        version = version if version is not None else sent
        if version is not None:
            self.policy_version = version
        self._loaded = version
        return count

    def poll_weights(self) -> int | None:
        """Between decoding steps (``rollout.inflight_updates``): load the weight stream the actor sent, if one has
        arrived, and return its version; None, without waiting, when none has."""
        if self._weights_from is None or not self.comm.pending(*self._weights_from):
            return None
        version, _ = self._receive(*self._weights_from)
        if version is None:  # the flow always sends it; a stream without one cannot be stamped on tokens
            raise RuntimeError(f"weights from {self._weights_from} arrived while generating without their version")
        self.policy_version = self._loaded = version
        return version

    def _receive(self, src_group: str, src_rank: int) -> tuple[int | None, int]:
        """Receive one weight stream into the generation model; (the version it was sent with, tensors received)."""
        from m2flow.runtime.comm import recv_versioned_weights

        module = self._module()
        with self.tracer.span("receive_weights", cat="weight_sync"), torch.no_grad():
            version, weights = recv_versioned_weights(self.comm, src_group, src_rank, into=module)
            if module is None:  # an engine of its own (vLLM): it loads the received copies
                self.backend.load_weights(weights)
        return version, len(weights)

    def weights_digest(self) -> str:
        """Digest of the generation model's weights (see ``state_digest``)."""
        return self.generation.weights_digest()
