"""Partial rollouts of multi-turn episodes (``rollout.partial``): an iteration hands out the GRPO groups that
finished first; the episodes still running stay alive, policy side and environment side, and go on in the next
iteration under the weights it plays with.

The reasoning workflow's partial rollouts (``m2flow/workers/partial.py``) pause a token stream; here the unit of
work is an episode in the middle of its turn loop, whose environment holds state no checkpoint can hold in
general (a tool's session, a process). So nothing is paused: the turn loop (``turn_loop.play_turns``) stops at a
round boundary once the iteration's quota of groups has finished, and the next iteration's loop continues the
running episodes (their contexts, tokens, log-probs, per-token versions, masks, and their environments, which
stay mid-episode in their env workers or the rollout's process) together with the new ones. The accounting is the same as
reasoning's:

- A rank owes each iteration ``quota`` groups. The first iteration of a run takes one batch of groups more than
  it owes (over-provisioning), every later one as many as it hands out, so one batch is always carried.
- A group whose every episode has ended takes the next slot of the quota; past the quota it is kept whole and
  handed out first in the next iteration. Every group taken is handed out exactly once or still held.
- Staleness per token: a group trained at iteration k holds no model token sampled by weights older than
  k - ``max_staleness``. A group that could not be trained after iteration k is due at k: it takes a slot of
  k's quota before any other, and the loop waits for it (a slot is kept for each due group still running), so
  an episode slowed by its tool is waited for, not thrown away. Only a group that still could not make it
  (more due groups than slots) starts over from its reset, every episode of it (counted as restarted); the
  task instance (its seed) is kept.
- Counts: ``StepCounts`` (``rollout/partial_resumed_count``, ``..._restarted_count``, ``..._carried_count``).

A checkpoint holds the carried task instances (their episodes' ids, slots and seeds), not their episodes: an
environment's state is not something a checkpoint can take in general. A run resumed from it plays them again
from their resets (counted as restarted), so every task instance is still trained exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from m2flow.workers.agentic.turns import EpisodeSpec, TurnEngine
from m2flow.workers.partial import StepCounts


def oldest_version(engine: TurnEngine, traj_ids: Sequence[int]) -> int | None:
    """The oldest policy version among these episodes' model tokens (None: no model token yet)."""
    versions = [v for t in traj_ids for v in engine.trajectory(t).model_versions]
    return min(versions) if versions else None


@dataclass
class Opening:
    """What an iteration starts with: the episodes to reset and those that go on mid-episode."""

    reset: list[int]
    """not started: new, started over (a token too old) or restored from a checkpoint"""
    running: list[int]
    """started in an earlier iteration and still running (their environments mid-episode)"""


@dataclass
class PartialEpisodes:
    """The groups one rollout rank holds across iterations, and the quota of the iteration it plays."""

    max_staleness: int
    groups: dict[int, list[int]] = field(default_factory=dict)
    """task instance (its episodes' ``EpisodeSpec.slot``, unique in the run) -> its episodes' ids, in order taken"""
    finished: list[int] = field(default_factory=list)
    """groups whose every episode ended, past an iteration's quota: handed out first in the next one"""
    quota: list[int] = field(default_factory=list)
    """the slots of this iteration's quota not filled yet"""
    handed: list[tuple[int, int]] = field(default_factory=list)
    """this iteration's groups handed out: (task instance, slot)"""
    counts: StepCounts = field(default_factory=StepCounts)
    began: set[int] = field(default_factory=set)
    """the groups that started in an earlier iteration (a hand-out of one counts as resumed)"""
    restored: int = 0
    """groups given back by a checkpoint, not played yet (counted as restarted by the next ``begin``)"""
    due: set[int] = field(default_factory=set)
    """groups with a token too old to be trained after this iteration: they take the quota's slots first"""

    def begin(self, step: int, engine: TurnEngine, specs: Sequence[EpisodeSpec], quota: Sequence[int]) -> Opening:
        """Open iteration ``step`` owing a group for each slot of ``quota``: start over the held groups with a
        token too old, take the new episodes ``specs`` (into ``engine`` too); what to reset and what goes on."""
        self.counts, self.handed, self.quota = StepCounts(), [], list(quota)
        self.counts.restarted, self.restored = self.restored, 0
        # A group whose oldest token could not be trained at the next iteration is due: owed a slot of this one,
        # the loop waits for it (throttling) rather than start it over at the next, which would waste its turns and
        # tilt training towards the episodes that end fast (a group started over by a tool whose waits follow the
        # episode's seed waits the same again).
        self.due = set()
        for slot, ids in self.groups.items():
            oldest = oldest_version(engine, ids)
            if oldest is not None and oldest < step - self.max_staleness:
                engine.start_over(ids)  # a token would be too old when trained at this step: from the reset
                self.counts.restarted += 1
                if slot in self.finished:
                    self.finished.remove(slot)
            elif oldest is not None and oldest < step + 1 - self.max_staleness:
                self.due.add(slot)
        self.began = {slot for slot, ids in self.groups.items() if any(engine.episodes[t].started for t in ids)}
        engine.add_episodes(specs)
        for s in specs:
            self.groups.setdefault(s.slot, []).append(s.traj_id)
        if len(self.groups) < len(self.quota):
            raise ValueError(f"iteration {step}: {len(self.quota)} groups owed from {len(self.groups)} held")
        held = [t for ids in self.groups.values() for t in ids]
        return Opening(reset=[t for t in held if not engine.episodes[t].started],
                       running=[t for t in held if engine.episodes[t].started and not engine.episodes[t].done])

    def complete(self, slot: int) -> None:
        """Group ``slot``'s every episode has ended: it waits in ``finished`` for a slot of a quota."""
        if slot not in self.finished:
            self.finished.append(slot)

    def hand_out(self) -> list[tuple[int, int, list[int]]]:
        """The finished groups that take the quota's free slots: the due ones first, the others in the order they
        finished while a slot is left for each due group still running; (task instance, slot, its episodes' ids);
        they are let go."""
        out = []
        while self.finished and self.quota:
            instance = next((g for g in self.finished if g in self.due), None)
            if instance is None:
                running_due = sum(1 for g in self.due if g in self.groups and g not in self.finished)
                if len(self.quota) <= running_due:
                    break  # the slots left are the due groups'
                instance = self.finished[0]
            self.finished.remove(instance)
            self.due.discard(instance)
            out.append((instance, self.quota.pop(0), self.groups.pop(instance)))
            self.counts.resumed += instance in self.began
        self.handed.extend((instance, slot) for instance, slot, _ in out)
        return out

    def met(self) -> bool:
        """Whether the iteration's quota is filled (the turn loop may stop)."""
        return not self.quota

    def close(self) -> StepCounts:
        """The iteration's counts, once its quota is filled."""
        if self.quota:
            raise RuntimeError(f"{len(self.quota)} group(s) of the quota never finished")
        self.counts.carried = len(self.groups)
        return self.counts

    def state(self, engine: TurnEngine) -> list[list[int]]:
        """The held task instances as a checkpoint keeps them: per episode [traj id, slot, seed, env rank]."""
        return [[s.traj_id, s.slot, s.seed, s.env_rank] for ids in self.groups.values()
                for s in (engine.episodes[t].spec for t in ids)]

    def restore(self, engine: TurnEngine, state: Sequence[Sequence[int]]) -> None:
        """Hold the task instances of ``state`` (``state()``), not started: the next iteration plays them from
        their resets."""
        specs = [EpisodeSpec(*map(int, row)) for row in state]
        engine.add_episodes(specs)
        for s in specs:
            self.groups.setdefault(s.slot, []).append(s.traj_id)
        self.restored = len({s.slot for s in specs})
