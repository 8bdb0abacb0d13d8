"""Generating an iteration's response groups: the rollout's work, in whichever process holds the model.

``Generation`` runs inside a host worker. ``RolloutWorker`` hosts one over a model of its own, loaded
from the model path and refreshed by weight sync. When the plan fuses the rollout into the actor (rollout
on the actor's own devices, rank for rank: ``rollout.fuse_with_actor``), the actor hosts it over the
policy it trains (``generation_in``, the rollout's ``hosted_in``): generation reads the weights the last
optimizer step left, so there is no weight sync and no second copy of the model. Either way it takes the
host's device turns and stamps groups with the host's ``policy_version``.

A rank takes the prompts routed to it and generates them in one of two ways (the plan's ``generation``,
``RolloutSettings.batching``):

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
from typing import Any, Literal, Protocol
from collections.abc import Callable, Iterator

from torch import nn

from m2flow.backends.generation import GenerationBackend, SamplingParams
from m2flow.backends.generation.inflight import InFlight
from m2flow.data.batch import ResponseGroup, RolloutBatch, right_pad
from m2flow.models.weight_files import check_max_new_tokens
from m2flow.runtime.trace import trace_category
from m2flow.runtime.worker import Worker
from m2flow.workers.common import ReasoningWorker, derive_seed, state_digest
from m2flow.workers.config import DType, SamplingConfig
from m2flow.workers.messages import GroupSample, PromptTask
from m2flow.workers.partial import PartialRollouts
from m2flow.workers.reward import GroupScorer
from m2flow.workers.stats import WEIGHT_KEY
from m2flow.runtime.streams import GroupStream


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """The rollout: what it generates from and with, how (the plan's generation mode and chunking), from and
    to where. Only what a rollout rank reads: the config's batching keys are the plan's to resolve."""

    model_path: str
    backend: str
    """the generation backend's registered name"""
    dtype: DType = "float32"
    """weight dtype of the generation model (an actor hosting the rollout keeps its own)"""
    compile: bool = False
    """lean backend: decoding steps ``torch.compile``d"""
    sampling: SamplingConfig
    prompts: GroupStream
    responses: GroupStream
    """where its groups go (scored when the reward is hosted with it)"""
    seed: int = 0
    batching: Literal["continuous", "chunked"] = "chunked"
    """the plan's generation mode"""
    max_running: int = 256
    """continuous: most responses decoded at once (the plan's)"""
    prompts_per_chunk: int | None = None
    """chunked: prompts per generate call (the plan's; None: all at once)"""
    emit_each_group: bool = True
    """continuous: send each group as it finishes (False: at the end of the turn; the plan's ``emit``)"""
    shares_devices: bool = False
    offload: bool = False
    partial: bool = False
    """continuous: partial rollouts (``partial.py``): a step hands out the groups that finish first, the others
    carry on into the next step"""
    max_staleness: int = 0
    """partial: the bound on every trained token's age (a carried row with an older token starts over)"""
    inflight_updates: bool = False
    """partial: load weights the actor sends while generating, between decoding steps (the host's poll)"""

    def hosted_in(self, host: Worker) -> Generation:
        """The rollout inside an actor rank (``rollout.fuse_with_actor``): generation over the policy it trains."""
        return generation_in(host, self)


def sampling_params(s: SamplingConfig) -> SamplingParams:
    """The backend's sampling parameters for a sampling config."""
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


class LendsModel(Protocol):
    """A host that lends its model to a hosted rollout (the actor: the policy it trains)."""

    policy_version: int

    def lent_model(self) -> tuple[nn.Module, Any]:
        """(the model, trained in place, and its tokenizer)."""
        ...


def generation_in(host: Any, settings: RolloutSettings) -> Generation:
    """The rollout hosted in ``host`` (a ``LendsModel`` reasoning worker): generation over the host's own
    model, scoring with the reward when that is hosted there too."""
    from m2flow.backends.generation import GenerationOptions, generation_backend_over

    module, tokenizer = host.lent_model()
    options = GenerationOptions(device=host.torch_device, dtype=settings.dtype, seed=settings.seed,
                                compile=settings.compile)
    backend = generation_backend_over(settings.backend, module, tokenizer, options)
    module.train()  # backends put their model in eval mode; generation does so per call instead
    return Generation(host, backend, settings, scorer=host.hosted("reward"), shared_model=module)


class Generation:
    """``generate`` and ``evaluate`` over ``backend``, inside the reasoning worker ``host``."""

    def __init__(self, host: ReasoningWorker, backend: GenerationBackend, settings: RolloutSettings, *,
                 scorer: GroupScorer | None = None, shared_model: nn.Module | None = None,
                 poll_weights: Callable[[], int | None] | None = None) -> None:
        """Generate with ``backend`` the prompts taken from ``settings.prompts`` into ``settings.responses``;
        with ``scorer`` (the reward hosted in the same process) groups leave scored. ``shared_model``: a model
        shared with training, put in eval mode while generating (None: the backend's own). ``poll_weights``
        (partial rollouts with ``inflight_updates``): called between decoding steps, loads newer weights that
        have arrived and returns their version (``InFlight.poll``)."""
        check_max_new_tokens("rollout.sampling.max_new_tokens", settings.sampling.max_new_tokens, backend.module)
        self.host = host
        self.backend = backend
        self.settings = settings
        self.prompts = settings.prompts
        self.responses = settings.responses
        self.scorer = scorer
        self.rollout_seed = settings.seed
        self.params = sampling_params(settings.sampling)
        self.pad_id = int(backend.pad_id)
        self.generation_model = shared_model
        self.emit_each_group = settings.emit_each_group
        self.batching = settings.batching
        if self.batching == "continuous" and not getattr(backend, "continuous", False):
            raise ValueError(f"batching 'continuous' needs a backend with continuous batching, "
                             f"not {settings.backend!r}")
        self.partial: PartialRollouts | None = None
        """With ``settings.partial``: the prompts carried between steps."""
        if settings.partial:
            if self.batching != "continuous":
                raise ValueError("partial rollouts need continuous batching (rollout.batching)")
            self.partial = PartialRollouts(settings.max_staleness)
        if settings.inflight_updates and (self.partial is None or poll_weights is None):
            raise ValueError("in-flight weight updates need partial rollouts in a rollout worker of their own "
                             "(rollout.inflight_updates needs rollout.partial)")
        self.poll_weights = poll_weights

    @trace_category("generate")
    def generate(self, step: int, num_slots: int, owed_slots: int | None = None) -> dict[str, float]:
        """Generate the groups of this rank's prompts of iteration ``step``; returns rollout metrics.
        ``owed_slots`` (partial rollouts): the iteration's groups downstream waits for, slots 0..owed_slots - 1
        (None: all ``num_slots``); the prompts of higher slots are the over-provisioned ones."""
        rank = self.host.rank
        tasks: list[PromptTask] = self.prompts.take(rank, self.prompts.expected(rank, num_slots))
        tasks.sort(key=lambda t: t.slot)
        if self.scorer is not None:
            self.scorer.reset()
        self._tally = _Tally()
        partial: dict[str, float] = {}
        if self.partial is not None:
            owed = num_slots if owed_slots is None else owed_slots
            partial = self._generate_partial(step, tasks, [t.slot for t in tasks if t.slot < owed])
        elif self.batching == "continuous":
            self._generate_continuous(step, tasks)
        else:
            self._generate_chunked(step, tasks)
        t = self._tally
        n = max(1, len(t.lengths))
        metrics = self.scorer.metrics(step) if self.scorer is not None else {}
        return metrics | partial | {
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
        rank, tracer = self.host.rank, self.host.tracer
        chunk = self.settings.prompts_per_chunk or max(1, len(tasks))
        starts = range(0, len(tasks), chunk)
        for k, start in enumerate(starts):
            part = tasks[start : start + chunk]
            params = replace(self.params, seed=derive_seed(self.rollout_seed, step, rank, k))
            with self.host.turn(last=k == len(starts) - 1), eval_mode(self.generation_model):
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
        tracer = self.host.tracer
        seeds = [derive_seed(self.rollout_seed, step, t.slot) for t in tasks]
        with self.host.turn(), eval_mode(self.generation_model):
            t0 = time.perf_counter()
            with tracer.span("generate", cat="generate", step=step, prompts=len(tasks)):
                stream = self.backend.generate_stream([t.prompt_ids for t in tasks], self.params, seeds,
                                                      self.settings.max_running)
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

    def _generate_partial(self, step: int, tasks: list[PromptTask], owed: list[int]) -> dict[str, float]:
        """Partial rollouts in one device turn (``partial.py``): the groups that finish first fill the ``owed``
        slots, the rest carry on. A new prompt is seeded by (seed, step, slot) as in continuous batching; a
        carried one keeps its seed."""
        assert self.partial is not None
        new = [(t, derive_seed(self.rollout_seed, step, t.slot)) for t in tasks]
        held: list[tuple[PromptTask, ResponseGroup]] = []

        def stream(prompts: list[list[int]], seeds: list[int], flight: InFlight) -> Iterator[list[ResponseGroup]]:
            flight.poll = self.poll_weights  # None: the weights stay those the call started with
            return self.backend.generate_stream(prompts, self.params, seeds, self.settings.max_running, flight=flight)

        def emit(done: list[tuple[PromptTask, ResponseGroup]]) -> None:
            if self.emit_each_group:
                self._emit(step, done)
            else:
                held.extend(done)

        with self.host.turn(), eval_mode(self.generation_model):
            t0 = time.perf_counter()
            with self.host.tracer.span("generate", cat="generate", step=step, prompts=len(tasks)):
                counts = self.partial.step(stream, step, self.host.policy_version, new, owed, emit)
            self._tally.busy += time.perf_counter() - t0
        if held:
            self._emit(step, sorted(held, key=lambda d: d[0].slot))
        return counts.metrics()

    def partial_state(self) -> list[dict[str, Any]]:
        """What partial rollouts carry into the next step, as a checkpoint holds it (``PartialRollouts.state``)."""
        return self.partial.state() if self.partial is not None else []

    def restore_partial(self, state: list[dict[str, Any]]) -> None:
        """Carry ``state`` (what a checkpoint held) into the next step."""
        if self.partial is None:
            raise RuntimeError("carried prompts given to a rollout without partial rollouts")
        self.partial.restore(state)

    def carried_prompts(self) -> list[PromptTask]:
        """The prompts partial rollouts carry into the next step, as they came."""
        return [c.task for c in self.partial.carried] if self.partial is not None else []

    def _emit(self, step: int, done: list[tuple[PromptTask, ResponseGroup]]) -> None:
        """Score (when fused) and send finished groups downstream, one message per next-stage rank."""
        tracer, t = self.host.tracer, self._tally
        samples = []
        for task, group in done:
            batch = RolloutBatch.from_groups([group], self.pad_id, group_ids=[task.slot])
            texts = [r.text or "" for r in group.responses]
            version = self.host.policy_version
            if self.partial is not None:
                # Partial rollouts mix versions within a response: each token keeps its own; the group
                # counts as old as its oldest token (what the actor's staleness bound checks).
                tokens = [r.versions or [version] * len(r.token_ids) for r in group.responses]
                batch.token_versions = right_pad(tokens, 0)
                version = min(v for row in tokens for v in row)
            samples.append(GroupSample(step, task.slot, task.index, task.answer, texts, batch, version=version))
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
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, stop=tuple(stop))
        out: list[tuple[str, int]] = []
        with self.host.turn(), eval_mode(self.generation_model), \
                self.host.tracer.span("evaluate", cat="generate", prompts=len(prompt_ids)):
            for start in range(0, len(prompt_ids), batch_size):
                for g in self.backend.generate(prompt_ids[start : start + batch_size], params):
                    out.append((g.responses[0].text or "", len(g.responses[0].token_ids)))
        return out

    def weights_digest(self) -> str:
        """Digest of the weights generated from (see ``state_digest``)."""
        module = self.backend.module
        if module is None:
            raise NotImplementedError(f"backend {self.settings.backend!r} does not expose its weights")
        return state_digest(module.state_dict())
