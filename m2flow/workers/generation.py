"""Generating an iteration's response groups: the rollout's work, in whichever process holds the model.

``GeneratesGroups`` is a mixin of a reasoning worker. ``RolloutWorker`` uses it over a model of its
own, loaded from the model path and refreshed by weight sync. When the rollout is placed on the
actor's own devices, rank for rank, the actor worker uses it over the policy it trains
(``rollout.fuse_with_actor``): generation reads the weights the last optimizer step left, so there is
no weight sync and no second copy of the model.

A rank takes the prompts routed to it and generates them in one of two ways (``rollout.batching``,
resolved by ``batching_mode``):

- **continuous** (backends with ``generate_stream``): one device turn, a running batch of at most
  ``max_running`` responses; each group goes into the output stream the moment its last response
  ends, and waiting prompts take the freed rows. Prompt ``slot`` is seeded by (seed, step, slot).
- **chunked**: chunks of ``prompts_per_chunk`` prompts (one device turn each, so collocated
  components can run between chunks), a chunk's groups put when it ends; chunk k is seeded by
  (seed, step, rank, k).

Either way a run, and a run resumed from a checkpoint, draw the same responses, fused or not.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Iterator

from torch import nn

from m2flow.backends.generation import GenerationBackend, SamplingParams
from m2flow.data.batch import ResponseGroup, RolloutBatch
from m2flow.models.weight_files import check_max_new_tokens
from m2flow.runtime.trace import trace_category
from m2flow.workers.common import derive_seed
from m2flow.workers.config import RolloutConfig, batching_mode
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


@dataclass
class _Tally:
    """What an iteration's generation produced so far, for its metrics."""

    lengths: list[int] = field(default_factory=list)
    truncated: int = 0
    busy: float = 0.0
    emits: int = 0


class GeneratesGroups:
    """``generate`` and ``evaluate`` of a reasoning worker over ``self.backend`` (after ``setup_generation``)."""

    backend: GenerationBackend | None = None
    generation_model: nn.Module | None = None
    """A model shared with training, put in eval mode while generating (None: the backend's own)."""
    policy_version: int = 0
    """The version of the weights generated from (iterations trained); stamped on every group."""

    def setup_generation(self, backend: GenerationBackend, cfg: RolloutConfig, prompts: GroupStream,
                         responses: GroupStream, *, seed: int, scorer: dict[str, Any] | None = None,
                         shared_model: nn.Module | None = None, emit_each_group: bool = True) -> None:
        """Generate with ``backend`` the prompts taken from ``prompts`` into ``responses``; with ``scorer``
        (``GroupScorer`` keyword arguments) groups leave scored. ``emit_each_group`` (continuous batching):
        send each group as it finishes; False: all at the end of the turn (the plan's ``emit``, for a
        next stage that could not take them earlier anyway)."""
        check_max_new_tokens("rollout.sampling.max_new_tokens", cfg.sampling.max_new_tokens, backend.module)
        self.backend = backend
        self.rollout_cfg = cfg
        self.prompts = prompts
        self.responses = responses
        self.scorer = GroupScorer(**scorer) if scorer is not None else None
        self.rollout_seed = seed
        self.params = sampling_params(cfg)
        self.pad_id = int(backend.pad_id)
        self.generation_model = shared_model
        self.emit_each_group = emit_each_group
        self.batching = batching_mode(cfg)
        if self.batching == "continuous" and not getattr(backend, "continuous", False):
            raise ValueError(f"batching 'continuous' needs a backend with continuous batching, not {cfg.backend!r}")

    def _generating(self) -> None:
        if self.backend is None:
            raise RuntimeError(f"{type(self).__name__} rank {self.rank} does not generate (no rollout fused here)")  # type: ignore[attr-defined]

    @trace_category("generate")
    def generate(self, step: int, num_slots: int) -> dict[str, float]:
        """Generate the groups of this rank's prompts of iteration ``step``; returns rollout metrics."""
        self._generating()
        rank = self.rank  # type: ignore[attr-defined]
        tasks: list[PromptTask] = self.prompts.take(rank, self.prompts.expected(rank, num_slots))
        tasks.sort(key=lambda t: t.slot)
        if self.scorer is not None:
            self.scorer.reset()
        self._tally = _Tally()
        if self.batching == "continuous":
            self._generate_continuous(step, tasks)
        else:
            self._generate_chunked(step, tasks)
        t = self._tally
        n = max(1, len(t.lengths))
        metrics = self.scorer.metrics(step) if self.scorer is not None else {}
        return metrics | {
            "rollout/response_length": sum(t.lengths) / n,
            "rollout/response_length_max": float(max(t.lengths, default=0)),
            "rollout/truncated_frac": t.truncated / n,
            "rollout/tokens_count": float(sum(t.lengths)),
            "rollout/responses_count": float(len(t.lengths)),
            "rollout/emits_count": float(t.emits),
            "time/generate": t.busy,
            WEIGHT_KEY: float(len(t.lengths)),
        }

    def _generate_chunked(self, step: int, tasks: list[PromptTask]) -> None:
        """``prompts_per_chunk`` prompts per backend call, one device turn each, chunk k seeded by
        (seed, step, rank, k); a chunk's groups go on when it ends."""
        rank, tracer = self.rank, self.tracer  # type: ignore[attr-defined]
        chunk = self.rollout_cfg.prompts_per_chunk or max(1, len(tasks))
        starts = range(0, len(tasks), chunk)
        for k, start in enumerate(starts):
            part = tasks[start : start + chunk]
            params = replace(self.params, seed=derive_seed(self.rollout_seed, step, rank, k))
            with self.turn(last=k == len(starts) - 1), eval_mode(self.generation_model):  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                with tracer.span("generate", cat="generate", step=step, prompts=len(part)):
                    groups = self.backend.generate([t.prompt_ids for t in part], params)
                self._tally.busy += time.perf_counter() - t0
            # Put after the device turn: a consumer waiting for the lock must not block a full channel.
            self._emit(step, list(zip(part, groups)))

    def _generate_continuous(self, step: int, tasks: list[PromptTask]) -> None:
        """Continuous batching in one device turn: each group goes on as soon as its last response ends.
        Prompt ``slot`` samples from its own generator seeded by (seed, step, slot), so its responses do
        not depend on the rank, on ``max_running`` or on what else was in the batch."""
        tracer = self.tracer  # type: ignore[attr-defined]
        seeds = [derive_seed(self.rollout_seed, step, t.slot) for t in tasks]
        with self.turn(), eval_mode(self.generation_model):  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            with tracer.span("generate", cat="generate", step=step, prompts=len(tasks)):
                stream = self.backend.generate_stream([t.prompt_ids for t in tasks], self.params, seeds,
                                                      self.rollout_cfg.max_running)
                held: list[tuple[PromptTask, ResponseGroup]] = []
                for groups in stream:
                    done = [(tasks[g.prompt_index], g) for g in groups]
                    if self.emit_each_group:
                        # The streams are unbounded (an iteration's data always fits): putting inside
                        # the turn cannot block on a consumer that waits for these devices.
                        self._emit(step, done)
                    else:
                        held.extend(done)
            self._tally.busy += time.perf_counter() - t0
        if held:
            self._emit(step, sorted(held, key=lambda d: d[0].slot))

    def _emit(self, step: int, done: list[tuple[PromptTask, ResponseGroup]]) -> None:
        """Score (when fused) and send finished groups downstream, one message per next-stage rank."""
        tracer, t = self.tracer, self._tally  # type: ignore[attr-defined]
        samples = []
        for task, group in done:
            batch = RolloutBatch.from_groups([group], self.pad_id, group_ids=[task.slot])
            texts = [r.text or "" for r in group.responses]
            samples.append(GroupSample(step, task.slot, task.index, task.answer, texts, batch,
                                       version=self.policy_version))
            t.lengths.extend(len(r.token_ids) for r in group.responses)
            t.truncated += sum(r.finish_reason == "length" for r in group.responses)
        if self.scorer is not None:
            with tracer.span("reward", cat="reward", step=step, groups=len(samples)):
                self.scorer.score(samples)
        with tracer.span("send", cat="generate", step=step, groups=len(samples)):
            self.responses.put_many(samples)
        t.emits += 1

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
