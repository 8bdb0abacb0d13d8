"""Generating an iteration's response groups: the rollout's work, in whichever process holds the model.

``GeneratesGroups`` is a mixin of a reasoning worker. ``RolloutWorker`` uses it over a model of its
own, loaded from the model path and refreshed by weight sync. When the rollout is placed on the
actor's own devices, rank for rank, the actor worker uses it over the policy it trains
(``rollout.fuse_with_actor``): generation reads the weights the last optimizer step left, so there is
no weight sync and no second copy of the model.

A rank takes the prompts routed to it, generates them in chunks of ``prompts_per_chunk`` (one device
turn each, so collocated components can run between chunks) and puts every group into the output
stream as soon as its chunk is done. Sampling is seeded by (seed, step, rank, chunk): a run, and a
run resumed from a checkpoint, draw the same responses, fused or not.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from collections.abc import Iterator

from torch import nn

from m2flow.backends.generation import GenerationBackend, SamplingParams
from m2flow.data.batch import RolloutBatch
from m2flow.runtime.trace import trace_category
from m2flow.workers.common import derive_seed
from m2flow.workers.config import RolloutConfig
from m2flow.workers.messages import GroupSample, PromptTask
from m2flow.workers.reward import GroupScorer
from m2flow.workers.stats import WEIGHT_KEY
from m2flow.workers.streams import GroupStream


def sampling_params(cfg: RolloutConfig) -> SamplingParams:
    """The backend's sampling parameters for a rollout config."""
    s = cfg.sampling
    return SamplingParams(n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          max_new_tokens=s.max_new_tokens, stop=tuple(s.stop))


@contextmanager
def eval_mode(module: nn.Module | None) -> Iterator[None]:
    """``module`` in eval mode for the block, its previous mode restored after (None: nothing to do)."""
    if module is None or not module.training:
        yield
        return
    module.eval()
    try:
        yield
    finally:
        module.train()


class GeneratesGroups:
    """``generate`` and ``evaluate`` of a reasoning worker over ``self.backend`` (after ``setup_generation``)."""

    backend: GenerationBackend | None = None
    generation_model: nn.Module | None = None
    """A model shared with training, put in eval mode while generating (None: the backend's own)."""
    policy_version: int = 0
    """The version of the weights generated from (iterations trained); stamped on every group."""

    def setup_generation(self, backend: GenerationBackend, cfg: RolloutConfig, prompts: GroupStream,
                         responses: GroupStream, *, seed: int, scorer: dict[str, Any] | None = None,
                         shared_model: nn.Module | None = None) -> None:
        """Generate with ``backend`` the prompts taken from ``prompts`` into ``responses``; with ``scorer``
        (``GroupScorer`` keyword arguments) groups leave scored."""
        self.backend = backend
        self.rollout_cfg = cfg
        self.prompts = prompts
        self.responses = responses
        self.scorer = GroupScorer(**scorer) if scorer is not None else None
        self.rollout_seed = seed
        self.params = sampling_params(cfg)
        self.pad_id = int(backend.pad_id)
        self.generation_model = shared_model

    def _generating(self) -> None:
        if self.backend is None:
            raise RuntimeError(f"{type(self).__name__} rank {self.rank} does not generate (no rollout fused here)")  # type: ignore[attr-defined]

    @trace_category("generate")
    def generate(self, step: int, num_slots: int) -> dict[str, float]:
        """Generate the groups of this rank's prompts of iteration ``step``; returns rollout metrics."""
        self._generating()
        rank, tracer = self.rank, self.tracer  # type: ignore[attr-defined]
        tasks: list[PromptTask] = self.prompts.take(rank, self.prompts.expected(rank, num_slots))
        tasks.sort(key=lambda t: t.slot)
        if self.scorer is not None:
            self.scorer.reset()
        chunk = self.rollout_cfg.prompts_per_chunk or max(1, len(tasks))
        lengths: list[int] = []
        truncated = 0
        busy = 0.0
        starts = range(0, len(tasks), chunk)
        for k, start in enumerate(starts):
            part = tasks[start : start + chunk]
            params = replace(self.params, seed=derive_seed(self.rollout_seed, step, rank, k))
            with self.turn(last=k == len(starts) - 1), eval_mode(self.generation_model):  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                with tracer.span("generate", cat="generate", step=step, prompts=len(part)):
                    groups = self.backend.generate([t.prompt_ids for t in part], params)
                busy += time.perf_counter() - t0
            # Put after the device turn: a consumer waiting for the lock must not block a full channel.
            samples = []
            for task, group in zip(part, groups):
                batch = RolloutBatch.from_groups([group], self.pad_id, group_ids=[task.slot])
                texts = [r.text or "" for r in group.responses]
                samples.append(GroupSample(step, task.slot, task.index, task.answer, texts, batch,
                                           version=self.policy_version))
                lengths.extend(len(r.token_ids) for r in group.responses)
                truncated += sum(r.finish_reason == "length" for r in group.responses)
            if self.scorer is not None:
                with tracer.span("reward", cat="reward", step=step, groups=len(samples)):
                    self.scorer.score(samples)
            with tracer.span("send", cat="generate", step=step, groups=len(samples)):
                self.responses.put_many(samples)  # the chunk's groups: one message per next-stage rank
        n = max(1, len(lengths))
        metrics = self.scorer.metrics(step) if self.scorer is not None else {}
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
        self._generating()
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, stop=tuple(stop))
        out: list[tuple[str, int]] = []
        with self.turn(), eval_mode(self.generation_model), \
                self.tracer.span("evaluate", cat="generate", prompts=len(prompt_ids)):  # type: ignore[attr-defined]
            for start in range(0, len(prompt_ids), batch_size):
                for g in self.backend.generate(prompt_ids[start : start + batch_size], params):
                    out.append((g.responses[0].text or "", len(g.responses[0].token_ids)))
        return out
