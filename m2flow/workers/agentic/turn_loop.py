"""The multi-turn loop, written once: the policy writes a turn, the environments answer, until every episode ends.

``play_turns`` drives a batch of episodes, keyed by trajectory id, between two sides:

- a ``TurnPolicy`` holds the episodes' contexts and budgets and writes one turn for each running episode
  (``TurnEngine`` with a backend at hand in ``run_episodes``; ``AgenticRolloutWorker`` itself when the
  environments live in its process; the rollout ranks of a flow, ``workflows/agentic/sides.py``);
- a ``TurnEnvs`` resets and steps the episodes' environments (``EnvsInProcess`` over ``TextEnvs``; the
  env workers of a flow, which may be lost and restarted).

One round is one ``play_turn`` (the policy's turn for every running episode not waiting for an answer; the
token budget may cut some), one ``step`` of the environments given an action, and one ``observe`` of their
answers (the turn budget ends episodes there). A ``step`` may give back only the answers that have come
(``EnvWorkers`` with ``env.async_steps``): the others' episodes wait and play on in a later round, so a slow
tool call holds up its own episode, not the round. An environment side that lost an episode's environment
(a dead or hung env worker) says so; the loop puts the episode back to its start on the policy (``rerun``)
and resets it again, under its own id, so every episode ends exactly once. The loop's own metric keys are
written in ``Rounds.metrics``.

Partial rollouts (``partial_episodes.py``) stop the loop early and resume it: ``until`` is asked at every
round boundary whether the iteration has what it owes, and the episodes still running then stay as they are
on both sides (``Rounds.open``); the next call continues them (``running``) together with new ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from m2flow.envs.text.batch import EnvStep


class TurnPolicy(Protocol):
    """The model's side of a batch of episodes, keyed by trajectory id."""

    def start_episodes(self, first: Mapping[int, EnvStep]) -> list[int]:
        """Start episodes from their first observations; the ids of those that ended at once."""
        ...

    def play_turn(self, round_: int) -> tuple[dict[int, str], list[int]]:
        """One turn of every running episode: (the actions by id, the ids the token budget ended)."""
        ...

    def observe(self, results: Mapping[int, EnvStep]) -> list[int]:
        """Record the environments' answers to the last turn; the ids of the episodes that ended."""
        ...

    def rerun(self, traj_ids: Sequence[int]) -> None:
        """Put these running episodes back to their start (their environment was lost)."""
        ...


class TurnEnvs(Protocol):
    """The environments' side of a batch of episodes, keyed by trajectory id."""

    def reset(self, traj_ids: Sequence[int]) -> tuple[dict[int, EnvStep], list[int]]:
        """Reset these episodes' environments: (the first observations by id, the ids whose environment was lost
        and gave none)."""
        ...

    def step(self, actions: Mapping[int, str]) -> tuple[dict[int, EnvStep], list[int]]:
        """Step the episodes given an action: (the answers by id, the ids whose environment was lost and gave none)."""
        ...

    def end(self, traj_ids: Sequence[int]) -> None:
        """These episodes have ended (by their environment or by a budget): their environments get no more steps."""
        ...


@dataclass(frozen=True)
class Rounds:
    """What one ``play_turns`` took: its rounds and the seconds spent waiting on each side."""

    rounds: int
    generate_s: float
    """seconds in the policy's turns"""
    env_s: float
    """seconds in the environments' resets and steps (restarts of lost env workers included)"""
    open: tuple[int, ...] = ()
    """the episodes still running when ``until`` stopped the loop (they go on in the next call)"""

    def metrics(self) -> dict[str, float]:
        """The loop's metrics (``time/generate_busy_s`` and ``time/env_busy_s`` are the graph's timings of the
        rollout and env components)."""
        return {"time/env_busy_s": self.env_s, "time/generate_busy_s": self.generate_s,
                "rollout/rounds": float(self.rounds)}


def play_turns(policy: TurnPolicy, envs: TurnEnvs, traj_ids: Sequence[int], *, running: Sequence[int] = (),
               until: Callable[[], bool] | None = None) -> Rounds:
    """Play the episodes ``traj_ids`` (the policy holds them, not started yet) and ``running`` (started by an
    earlier call, their environments mid-episode) until every one has ended, or, with ``until``, until it says
    so at a round boundary (the episodes then open are left running: ``Rounds.open``)."""
    open_ids = set(traj_ids) | set(running)
    env_s = generate_s = 0.0

    def ended(ids: Sequence[int]) -> None:
        open_ids.difference_update(ids)
        envs.end(ids)

    def start(ids: list[int]) -> float:
        """Reset and start these episodes, again for those whose environment was lost; the seconds it took."""
        spent = 0.0
        while ids:
            t0 = time.perf_counter()
            first, lost = envs.reset(ids)
            spent += time.perf_counter() - t0
            ended(policy.start_episodes(first))
            ids = lost
        return spent

    env_s += start(sorted(traj_ids))
    round_ = 0
    while open_ids and not (until is not None and until()):
        t0 = time.perf_counter()
        actions, cut = policy.play_turn(round_)
        t1 = time.perf_counter()
        generate_s += t1 - t0
        ended(cut)  # a turn cut by the token budget is not an action to judge: its environment gets nothing
        results, lost = envs.step(actions)
        env_s += time.perf_counter() - t1
        if not (actions or cut or results or lost):
            raise RuntimeError(f"the turn loop stalled: {len(open_ids)} episode(s) open, none given a turn, none "
                               "answered by its environment")
        ended(policy.observe(results))
        again = sorted(t for t in lost if t in open_ids)
        if again:  # the lost environments' episodes that had not ended start over, under their own ids
            policy.rerun(again)
            env_s += start(again)
        round_ += 1
    return Rounds(round_, generate_s, env_s, tuple(sorted(open_ids)))
