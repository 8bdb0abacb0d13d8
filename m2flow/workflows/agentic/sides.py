"""The turn loop's two sides over a flow's groups: the rollout ranks (policy) and the env workers (environments).

``workers/agentic/turn_loop.play_turns`` drives them from the flow's loop thread, one call per rank per step
of the loop. Episodes are routed by their spec: group ``slot`` to rollout rank ``slot mod ranks`` (a GRPO
group stays on one rank, which streams it when its last episode ends), episode to env worker ``env_rank``.
An env worker that died or hung is restarted by the flow (``env_call``); its episodes come back as lost.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from m2flow.runtime.waiting import gather
from m2flow.envs.text.batch import EnvStep
from m2flow.runtime.executors import WorkerGroup
from m2flow.workers.agentic.turns import EpisodeSpec

V = TypeVar("V")

EnvRound = Callable[[dict[int, tuple[str, tuple]]], tuple[dict[int, Any], list[int]]]
"""Calls on env workers (``e -> (method, args)``), waited for: the answers of those that answered, and the
env workers lost (restarted already)."""


class RolloutRanks:
    """The rollout group's ranks as the turn loop's policy side (``turn_loop.TurnPolicy``)."""

    def __init__(self, rollout: WorkerGroup, ranks: int, specs: Sequence[EpisodeSpec], timeout: float,
                 groups_per_step: int | None = None) -> None:
        """``groups_per_step`` (partial rollouts, whose slots number a run's groups): group ``slot`` plays on
        rank ``(slot mod groups_per_step) mod ranks``, so each rank takes as many new groups as it owes."""
        self.rollout, self.ranks, self.timeout = rollout, ranks, timeout
        self.by_id = {s.traj_id: s for s in specs}
        self.groups_per_step = groups_per_step

    def rank_of(self, spec: EpisodeSpec) -> int:
        """The rollout rank that plays an episode (all of a group on one rank)."""
        slot = spec.slot if self.groups_per_step is None else spec.slot % self.groups_per_step
        return slot % self.ranks

    def _each(self, method: str, per_rank: list[tuple]) -> list[Any]:
        return gather([self.rollout.execute_each(method, per_rank)], self.timeout, f"rollout: {method}")[0]

    def _split(self, by_tid: Mapping[int, V]) -> list[tuple[dict[int, V]]]:
        """One argument tuple per rank: the entries of the episodes it plays."""
        return [({t: v for t, v in by_tid.items() if self.rank_of(self.by_id[t]) == r},) for r in range(self.ranks)]

    def start_episodes(self, first: Mapping[int, EnvStep]) -> list[int]:
        return [t for ended in self._each("start_episodes", self._split(first)) for t in ended]

    def play_turn(self, round_: int) -> tuple[dict[int, str], list[int]]:
        actions: dict[int, str] = {}
        cut: list[int] = []
        for acts, ended in self._each("play_turn", [(round_,)] * self.ranks):
            actions.update(acts)
            cut.extend(ended)
        return actions, cut

    def observe(self, results: Mapping[int, EnvStep]) -> list[int]:
        return [t for ended in self._each("observe", self._split(results)) for t in ended]

    def rerun(self, traj_ids: Sequence[int]) -> None:
        self._each("rerun", [([t for t in traj_ids if self.rank_of(self.by_id[t]) == r],) for r in range(self.ranks)])


class EnvWorkers:
    """The env workers as the turn loop's environment side (``turn_loop.TurnEnvs``)."""

    def __init__(self, env_round: EnvRound, specs: Sequence[EpisodeSpec], keep_running: bool = False,
                 overlap: bool = False, awaiting: Sequence[int] = ()) -> None:
        """``keep_running`` (partial rollouts): a reset leaves the running episodes alone, and an episode's end
        frees its environment for the next iteration's new ones. ``overlap`` (``env.async_steps``): a ``step``
        gives back the answers that have come and leaves the others out (``awaiting``, given to the next
        call; a loop stopped by partial rollouts hands them to the next iteration's)."""
        self.env_round = env_round
        self.by_id = {s.traj_id: s for s in specs}
        self.keep_running, self.overlap = keep_running, overlap
        self.awaiting: set[int] = set(awaiting)
        """episodes whose step is out on their env worker (``overlap``)"""
        self._returned: float | None = None  # when the last exchange came back

    def _by_env(self, traj_ids: Sequence[int]) -> dict[int, list[int]]:
        by_env: dict[int, list[int]] = defaultdict(list)
        for tid in traj_ids:
            by_env[self.by_id[tid].env_rank].append(tid)
        return by_env

    def _answer(self, calls: dict[int, tuple[str, tuple]], by_env: Mapping[int, list[int]]) -> tuple[dict[int, EnvStep], list[int]]:
        answered, lost = self.env_round(calls)
        out = {tid: step for out in answered.values() for tid, step in out.items()}
        # An episode asked about and not answered has no environment: its env worker was lost in this call, or
        # before it, between the iterations of partial rollouts (a restarted worker holds no episode).
        return out, [tid for tids in by_env.values() for tid in tids if tid not in out]

    def reset(self, traj_ids: Sequence[int]) -> tuple[dict[int, EnvStep], list[int]]:
        self.awaiting.difference_update(traj_ids)  # started over: a step still out is dropped by the reset
        by_env = self._by_env(traj_ids)
        method = "env_reset_more" if self.keep_running else "env_reset"
        return self._answer({e: (method, (tids, [self.by_id[t].seed for t in tids])) for e, tids in by_env.items()},
                            by_env)

    def step(self, actions: Mapping[int, str]) -> tuple[dict[int, EnvStep], list[int]]:
        if self.overlap:
            return self._exchange(actions)
        by_env = self._by_env(list(actions))
        return self._answer({e: ("env_step", ({t: actions[t] for t in tids},)) for e, tids in by_env.items()}, by_env)

    def _exchange(self, actions: Mapping[int, str]) -> tuple[dict[int, EnvStep], list[int]]:
        """Send the actions and take the answers that have come from every env worker with a step out (each
        waits for one of its own); the others stay out. An episode sent or out and now neither answered nor out
        on its worker has lost its environment."""
        asked = set(actions) | self.awaiting
        by_env = self._by_env(sorted(asked))
        # Each worker waits for the others' answers as long as the policy's side of the last round took: waiting
        # less would make more rounds (each a model turn), waiting more would idle the policy.
        linger = 0.0 if self._returned is None else time.perf_counter() - self._returned
        answered, _ = self.env_round({e: ("env_exchange", ({t: actions[t] for t in tids if t in actions}, linger))
                                      for e, tids in by_env.items()})
        self._returned = time.perf_counter()
        out: dict[int, EnvStep] = {}
        still: set[int] = set()
        for answers, pending in answered.values():
            out.update(answers)
            still.update(pending)
        self.awaiting = still & asked
        return out, sorted(t for t in asked if t not in out and t not in still)

    def end(self, traj_ids: Sequence[int]) -> None:
        """Nothing to send (an env worker steps only the episodes given an action, and the next iteration's
        ``env_reset`` starts every one of its environments anew), but with ``keep_running``: then the ended
        episodes' environments are freed for the next iteration's new episodes."""
        if self.keep_running and traj_ids:
            self.env_round({e: ("env_stop", (tids,)) for e, tids in self._by_env(traj_ids).items()})
