"""Partial rollouts (``rollout.partial``): a step hands out the groups that finished first; the prompts still
generating keep their rows' tokens and continue in the next step, under the weights that step has.

A rollout rank owes each step as many groups as it was given prompts of that step's batch (its
``quota``: the slots downstream waits for). It generates the prompts it carries from earlier steps (first:
they are further along) and the step's new ones in one continuous-batching stream, gives every group that
finishes the next slot of its quota, and closes the stream when the quota is met. The stream then pauses
(``InFlight.paused``): each unfinished prompt keeps its rows' tokens, log-probs and versions, and groups
that finished past the quota are kept whole. Nothing is discarded and nothing is sent twice: every prompt
taken is either handed out exactly once or still carried.

For anything to be carried, a rank must hold more prompts than its quota: the first step of a run takes
one batch of prompts more than it owes (the driver's over-provisioning, as APRIL does), and from then on each
step takes as many as it hands out. A checkpoint holds what is carried (``state``, plain values and tensors),
and a resumed run gives it back (``restore``) and goes on as the uninterrupted run does.

Staleness per token: a group trained at step k may hold no token sampled by weights older than
k - ``max_staleness``. A carried row with such a token starts over from its prompt (counted as
restarted); the prompt itself is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from m2flow.backends.generation.inflight import InFlight, PartialResponse
from m2flow.data.batch import ResponseGroup
from m2flow.workers.messages import PromptTask


@dataclass
class Carried:
    """A prompt taken in an earlier step and not handed out yet."""

    task: PromptTask
    """The prompt as it came (its step and slot are replaced by those it is handed out with)."""
    seed: int
    """The seed of its draws, kept across steps: a resumed row draws the uniforms it would have drawn anyway."""
    rows: list[PartialResponse] | None = None
    """Its n rows so far (None: not started, or started over)."""

    @property
    def oldest(self) -> int | None:
        """The oldest weight version among its tokens (None: no tokens)."""
        versions = [v for r in self.rows or [] for v in r.versions]
        return min(versions) if versions else None


@dataclass
class StepCounts:
    """What partial rollouts did in one step (its ``rollout/partial_*`` metrics)."""

    resumed: int = 0
    """groups handed out that had begun in an earlier step"""
    restarted: int = 0
    """carried prompts whose rows started over: a token older than the staleness bound"""
    carried: int = 0
    """prompts carried on to the next step"""
    updates: int = 0
    """weight updates loaded while the step generated (in-flight updates; ``InFlight.updates``)"""

    def metrics(self) -> dict[str, float]:
        """The counts as metrics; named ``..._count`` so that the ranks' counts add up (``merge_rank_metrics``)."""
        return {"rollout/partial_resumed_count": float(self.resumed),
                "rollout/partial_restarted_count": float(self.restarted),
                "rollout/partial_carried_count": float(self.carried),
                "rollout/inflight_updates_count": float(self.updates)}


PARTIAL_FILE = "partial_rollouts.pt"
"""The file of a checkpoint that holds every rollout rank's carried prompts (``state_file``, one list per rank)."""


def share_carried(saved: list[list[dict[str, Any]]], ranks: int) -> list[list[dict[str, Any]]]:
    """Each of ``ranks`` rollout ranks' carried prompts, from those ``len(saved)`` ranks saved: rank for rank when
    the counts agree (the run goes on exactly); otherwise all of them, in rank order, dealt round-robin, so none
    is lost or carried twice (each rank may then hold a different number than it did)."""
    if len(saved) == ranks:
        return [list(s) for s in saved]
    flat = [c for rank in saved for c in rank]
    return [flat[r::ranks] for r in range(ranks)]


Stream = Callable[[list[list[int]], list[int], InFlight], Iterator[list[ResponseGroup]]]
"""(prompts, seeds, in-flight side) -> the backend's stream of finished groups."""


class PartialRollouts:
    """The prompts a rollout rank carries between steps, and one step's generation over them."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self.carried: list[Carried] = []

    def step(self, stream: Stream, step: int, version: int, new: list[tuple[PromptTask, int]], quota: list[int],
             emit: Callable[[list[tuple[PromptTask, ResponseGroup]]], None]) -> StepCounts:
        """Generate the carried prompts and ``new`` ones ((task, seed) each) with weights of ``version`` until
        one group per slot of ``quota`` has been emitted (with ``emit``: tasks restamped with ``step`` and the
        slot); what is left is carried on."""
        counts = StepCounts()
        if len(quota) > len(self.carried) + len(new):
            raise ValueError(f"step {step}: {len(quota)} groups owed from {len(self.carried) + len(new)} prompts")
        for c in self.carried:
            oldest = c.oldest
            if oldest is not None and oldest < step - self.max_staleness:
                c.rows = None  # a token would be too old when trained at this step: start the prompt over
                counts.restarted += 1
        pool = self.carried + [Carried(task, seed) for task, seed in new]
        began = [c.rows is not None for c in pool]
        flight = InFlight(version=version, started=[c.rows for c in pool])
        out = stream([c.task.prompt_ids for c in pool], [c.seed for c in pool], flight)
        slots, handed, surplus = list(quota), set(), {}
        try:
            for groups in out:
                done = []
                for g in groups:
                    if slots:
                        done.append((replace(pool[g.prompt_index].task, step=step, slot=slots.pop(0)), g))
                        handed.add(g.prompt_index)
                        counts.resumed += began[g.prompt_index]
                    else:  # finished together with the last owed group: kept whole for the next step
                        surplus[g.prompt_index] = [PartialResponse(r.token_ids, r.logprobs, list(r.versions or []),
                                                                   r.finish_reason) for r in g.responses]
                if done:
                    emit(done)
                if not slots:
                    break
        finally:
            out.close()  # pauses the stream: its unfinished rows go into flight.paused
        self.carried = []
        for i, c in enumerate(pool):
            if i in handed:
                continue
            rows = surplus.get(i) or flight.paused.get(i) or c.rows  # never admitted: as it came
            self.carried.append(replace(c, rows=rows))
        counts.carried = len(self.carried)
        counts.updates = flight.updates
        return counts

    def state(self) -> list[dict[str, Any]]:
        """What is carried, in order, as plain values and tensors (what a checkpoint holds; ``carried_state``)."""
        return [carried_state(c) for c in self.carried]

    def restore(self, state: list[dict[str, Any]]) -> None:
        """Carry ``state`` (``state()`` of a saved rank, or a share of several) from now on, in its order."""
        self.carried = [carried_from_state(s) for s in state]


def carried_state(c: Carried) -> dict[str, Any]:
    """``c`` as plain values and tensors that load without running code (``state_file``): per row the token ids
    and versions as int64, the log-probs as float64 (exact for any Python float), the finish reason or None."""
    rows = None if c.rows is None else [
        {"token_ids": torch.tensor(r.token_ids, dtype=torch.int64), "logprobs": torch.tensor(r.logprobs, dtype=torch.float64),
         "versions": torch.tensor(r.versions, dtype=torch.int64), "finish_reason": r.finish_reason} for r in c.rows]
    return {"task": asdict(c.task), "seed": int(c.seed), "rows": rows}


def carried_from_state(s: dict[str, Any]) -> Carried:
    """The inverse of ``carried_state``."""
    rows = None if s["rows"] is None else [
        PartialResponse(r["token_ids"].tolist(), r["logprobs"].tolist(), r["versions"].tolist(), r["finish_reason"])
        for r in s["rows"]]
    return Carried(PromptTask(**s["task"]), int(s["seed"]), rows)
