"""``EnvWorker``: many text environments in one process, reset and stepped for the rollout.

An env worker holds a ``TextEnvBatch`` of the configured environment and plays the episodes the flow
assigns it, keyed by trajectory id: ``env_reset`` starts them, ``env_step`` steps those given an action,
``env_exchange`` starts steps and gives back the answers that have come (``env.async_steps``: the turn loop
goes on without the others), ``env_stats`` gives (and clears) the counts of calls and failures. An
environment that raises, hangs or returns a bad value ends only its own episode (``TextEnvBatch``); too
many such failures stop the run (``RunHealthError``). ``TextEnvs`` is that part alone: the env worker is
one, and when the plan fuses the ``env`` component into ``rollout`` the rollout worker hosts one
(``EnvSettings.hosted_in``). ``EnvsInProcess`` is a ``TextEnvs`` in the caller's process as the turn loop's
environment side (``turn_loop.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from m2flow.envs.text.batch import EnvStep, TextEnvBatch, TextEnvStats
from m2flow.runtime.worker import Worker


@dataclass(frozen=True, kw_only=True)
class EnvSettings:
    """What an env worker builds: the environment by name and its settings, how many, and their limits."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_envs: int = 1
    step_timeout_s: float | None = 10.0
    max_error_rate: float = 0.0
    concurrent: bool = False
    imports: tuple[str, ...] = ()
    """modules imported before the environment is built (where a custom environment registers itself)"""
    tool_format: str = "tag"
    """how the environments' tools read calls (``rewards/tools/formats.py``): the model's call format"""

    def hosted_in(self, host: Any) -> TextEnvs:
        """The environments inside a rollout rank (``env`` fused into ``rollout``)."""
        return TextEnvs(self.batch())

    def batch(self, max_error_rate: float | None = None) -> TextEnvBatch:
        """A new ``TextEnvBatch`` of these environments (``max_error_rate``: instead of the configured one)."""
        for module in self.imports:
            importlib.import_module(module)
        rate = self.max_error_rate if max_error_rate is None else max_error_rate
        return TextEnvBatch.from_registry(self.name, self.num_envs, self.kwargs, step_timeout_s=self.step_timeout_s,
                                          max_error_rate=rate, concurrent=self.concurrent,
                                          tool_format=self.tool_format)


class TextEnvs:
    """Environments keyed by trajectory id, for the episodes of one iteration at a time."""

    def __init__(self, envs: TextEnvBatch) -> None:
        self.envs = envs
        self._slots: dict[int, int] = {}  # trajectory id -> index of its environment
        self._env_stats = TextEnvStats()

    def env_reset(self, traj_ids: Sequence[int], seeds: Sequence[int]) -> dict[int, EnvStep]:
        """Start one episode per trajectory id (reset with its seed); the first observations, by id."""
        n = len(self.envs)
        if len(traj_ids) > n:
            raise ValueError(f"{len(traj_ids)} episodes for {n} environments")
        # Every environment is reset (the batch plays one episode each); the spare ones stop at once.
        padded = list(seeds) + [seeds[0] if seeds else 0] * (n - len(seeds))
        steps = self.envs.reset(padded)
        for i in range(len(traj_ids), n):
            self.envs.stop(i)
        self._slots = {tid: i for i, tid in enumerate(traj_ids)}
        return {tid: steps[i] for tid, i in self._slots.items()}

    def env_reset_more(self, traj_ids: Sequence[int], seeds: Sequence[int]) -> dict[int, EnvStep]:
        """Start these episodes (reset with their seeds) in environments no running episode holds (an id that
        holds one starts over in it), leaving the running episodes as they are: partial rollouts, whose
        unfinished episodes go on in the next iteration. The first observations, by id."""
        running = self.envs.running
        self._slots = {tid: i for tid, i in self._slots.items() if running[i] or tid in traj_ids}
        free = iter(sorted(set(range(len(self.envs))) - set(self._slots.values())))
        for tid in traj_ids:
            if tid not in self._slots:
                slot = next(free, None)
                if slot is None:
                    raise ValueError(f"{len(traj_ids)} more episodes for {len(self.envs)} environments, "
                                     f"{len(self._slots)} of them held")
                self._slots[tid] = slot
        steps = self.envs.reset_some({self._slots[tid]: seed for tid, seed in zip(traj_ids, seeds)})
        return {tid: steps[self._slots[tid]] for tid in traj_ids}

    def env_step(self, actions: Mapping[int, str]) -> dict[int, EnvStep]:
        """Step the episodes given an action (by trajectory id); what each environment answered."""
        # An id without an environment (this worker was restarted and holds none of it) gets no answer: lost.
        results = self.envs.step({self._slots[tid]: text for tid, text in actions.items() if tid in self._slots})
        by_index = {i: tid for tid, i in self._slots.items()}
        return {by_index[i]: step for i, step in results.items()}

    def env_exchange(self, actions: Mapping[int, str], linger_s: float = 0.0) -> tuple[dict[int, EnvStep], list[int]]:
        """Start stepping the episodes given an action (by trajectory id) and give back the answers that have
        come, waiting for one when steps are out and none has, and for the others up to ``linger_s``: (the
        answers by id, the ids whose steps are still out). An id without an environment here (a restarted
        worker) is neither: lost."""
        self.envs.send({self._slots[tid]: text for tid, text in actions.items() if tid in self._slots})
        answers = self.envs.receive(wait=True, linger_s=linger_s)
        by_index = {i: tid for tid, i in self._slots.items()}
        return {by_index[i]: step for i, step in answers.items()}, [by_index[i] for i in self.envs.stepping()]

    def env_stop(self, traj_ids: Sequence[int]) -> None:
        """End these episodes' environments from outside (a budget ran out): they take no more steps."""
        for tid in traj_ids:
            if tid in self._slots:  # none: a restarted worker, which never held it
                self.envs.stop(self._slots[tid])

    def env_stats(self, where: str = "") -> dict[str, float]:
        """The calls and failures since the last call (``env/...``) and the seconds their threads wanted a core
        (``time/env_cpu_s``); too many failures raise ``RunHealthError``."""
        stats = self.envs.pop_stats()
        self.envs.check_health(stats, where)
        return {**stats.as_metrics(), "time/env_cpu_s": stats.cpu_s}


class EnvWorker(TextEnvs, Worker):
    """An env worker: a process (of its own) holding ``settings.num_envs`` environments."""

    def __init__(self, *, settings: EnvSettings) -> None:
        TextEnvs.__init__(self, settings.batch())


class EnvsInProcess:
    """Environments at hand as the turn loop's environment side (``turn_loop.TurnEnvs``): none is ever lost."""

    def __init__(self, envs: TextEnvs, seeds: Mapping[int, int], keep_running: bool = False) -> None:
        self.envs, self.seeds, self.keep_running = envs, seeds, keep_running
        """``seeds``: each episode's reset seed, by trajectory id; ``keep_running``: a reset leaves the episodes
        still running alone (partial rollouts), instead of starting every environment anew"""

    def reset(self, traj_ids: Sequence[int]) -> tuple[dict[int, EnvStep], list[int]]:
        seeds = [self.seeds[t] for t in traj_ids]
        if self.keep_running:
            return self.envs.env_reset_more(traj_ids, seeds), []
        return self.envs.env_reset(traj_ids, seeds), []

    def step(self, actions: Mapping[int, str]) -> tuple[dict[int, EnvStep], list[int]]:
        return self.envs.env_step(actions), []

    def end(self, traj_ids: Sequence[int]) -> None:
        self.envs.env_stop(traj_ids)
