"""Demonstrations from MetaWorld's scripted experts, stored as packed observations, and success evaluation.

``collect_demos`` rolls each task's scripted policy (``metaworld.policies``, which reads the
39-dimensional state) in a :class:`~m2flow.envs.metaworld.MetaWorldPixelEnv` and records what a
pixel policy sees (the packed image / instruction / proprio observation) with the expert's action.
Episode ``k`` of every task is seeded ``seed + k`` (training seeds; evaluation uses
:func:`~m2flow.envs.metaworld.held_out_seeds`). ``action_noise`` perturbs the executed action
(not the recorded one), so the data covers states slightly off the expert's path (DART, Laskey et
al. 2017). Files are compressed ``.npz`` read without pickle; a bad file raises naming it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from m2flow.envs.metaworld import MetaWorldPixelEnv

logger = logging.getLogger(__name__)

ActFn = Callable[[np.ndarray], np.ndarray]
"""Packed observations (n, size) uint8 -> actions (n, A)."""


@dataclass
class Demos:
    """Expert steps of several episodes; step arrays have N rows, episode arrays E rows."""

    obs: np.ndarray
    """(N, size) uint8 packed observations (image, instruction ids, proprio)."""
    actions: np.ndarray
    """(N, A) float32 expert actions in [-1, 1]."""
    episode: np.ndarray
    """(N,) int64: the episode each step belongs to."""
    tasks: np.ndarray
    """(E,) str: each episode's task."""
    seeds: np.ndarray
    """(E,) int64: each episode's reset seed."""
    success: np.ndarray
    """(E,) bool: the expert solved the episode."""

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    def save(self, path: str | Path) -> Path:
        """Write a compressed ``.npz`` (no pickled objects). Written beside it, then renamed: a reader never
        sees half a file, and processes making the same file at once each leave a whole one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        with open(tmp, "wb") as f:  # a file object: savez would add ".npz" to a name not ending in it
            np.savez_compressed(f, obs=self.obs, actions=self.actions, episode=self.episode,
                                tasks=self.tasks.astype(np.str_), seeds=self.seeds, success=self.success)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Demos:
        """Read a file written by :meth:`save`; anything malformed raises ValueError naming the file."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in ("obs", "actions", "episode", "tasks", "seeds", "success")}
        except (OSError, ValueError, KeyError, EOFError) as error:
            raise ValueError(f"{path}: not a demonstrations file ({type(error).__name__}: {error})") from None
        demos = cls(**arrays)
        demos.check(str(path))
        return demos

    def check(self, name: str = "demos") -> None:
        """Raise ValueError (prefixed by ``name``) when the arrays disagree in shape or type."""
        n, e = len(self.obs), len(self.tasks)
        problems = []
        if self.obs.dtype != np.uint8 or self.obs.ndim != 2:
            problems.append(f"obs must be 2-D uint8, got {self.obs.dtype} {self.obs.shape}")
        if self.actions.ndim != 2 or len(self.actions) != n or not np.isfinite(self.actions).all():
            problems.append(f"actions must be (N={n}, A) finite, got {self.actions.shape}")
        if self.episode.shape != (n,) or (n and (self.episode.min() < 0 or self.episode.max() >= e)):
            problems.append(f"episode must be (N={n},) indices below E={e}")
        if self.seeds.shape != (e,) or self.success.shape != (e,):
            problems.append(f"seeds and success must have E={e} rows")
        if problems:
            raise ValueError(f"{name}: " + "; ".join(problems))


def expert_for(task: str) -> Any:
    """MetaWorld's scripted policy for ``task``."""
    from metaworld.policies import ENV_POLICY_MAP

    try:
        return ENV_POLICY_MAP[task]()
    except KeyError:
        raise ValueError(f"task: no scripted expert for {task!r}") from None


def collect_demos(
    tasks: list[str],
    episodes_per_task: int,
    seed: int = 0,
    action_noise: float = 0.0,
    keep_failures: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Demos:
    """Roll the experts ``episodes_per_task`` times on every task; ``progress(done, total)`` per episode."""
    obs, actions, episode, ep_tasks, ep_seeds, ep_success = [], [], [], [], [], []
    rng = np.random.default_rng(seed)
    total, done = len(tasks) * episodes_per_task, 0
    for task in tasks:
        env = MetaWorldPixelEnv(task, **(env_kwargs or {}))
        expert = expert_for(task)
        try:
            for k in range(episodes_per_task):
                o, _ = env.reset(seed=seed + k)
                steps_o, steps_a, solved, end = [], [], False, False
                while not end:
                    a = np.clip(expert.get_action(env.state), -1.0, 1.0).astype(np.float32)
                    steps_o.append(o)
                    steps_a.append(a)
                    executed = a + action_noise * rng.standard_normal(a.shape) if action_noise else a
                    o, _, term, trunc, info = env.step(executed)
                    solved |= info["success"] > 0
                    end = term or trunc
                done += 1
                if progress is not None:
                    progress(done, total)
                if not solved and not keep_failures:
                    logger.info("%s seed %d: the expert failed; episode left out", task, seed + k)
                    continue
                episode.append(np.full(len(steps_o), len(ep_tasks), dtype=np.int64))
                obs += steps_o
                actions += steps_a
                ep_tasks.append(task)
                ep_seeds.append(seed + k)
                ep_success.append(solved)
        finally:
            env.close()
    if not obs:
        raise RuntimeError("collect_demos: no episode was kept")
    return Demos(
        obs=np.stack(obs), actions=np.stack(actions), episode=np.concatenate(episode),
        tasks=np.array(ep_tasks, dtype=np.str_), seeds=np.array(ep_seeds, dtype=np.int64),
        success=np.array(ep_success, dtype=bool),
    )


def evaluate_success(
    act: ActFn, tasks: list[str], seeds: list[int], env_kwargs: dict[str, Any] | None = None, parallel: int = 1
) -> dict[str, float]:
    """Success rate of ``act`` per task over episodes reset with ``seeds``; all tasks step as one batch.

    An episode counts as solved when ``info['success']`` is set at any step. ``parallel`` episodes of
    each task (consecutive seeds) run side by side, so ``act`` sees up to ``len(tasks) * parallel``
    observations at a time; each episode is still a function of its seed and the actions alone.
    ``act`` returns one action per observation, (B, 4), or a chunk of K, (B, K, 4) (a VLA with
    ``chunk: K``): each env then takes its chunk's actions in order until the episode ends, rendering
    only the frame the next call reads, as the embodied workflow's env workers do.
    """
    if parallel < 1:
        raise ValueError(f"parallel: must be >= 1, got {parallel}")
    width = min(parallel, len(seeds))
    envs = [MetaWorldPixelEnv(task, **(env_kwargs or {})) for task in tasks for _ in range(width)]
    solved = np.zeros((len(tasks), len(seeds)), dtype=bool)
    try:
        for first in range(0, len(seeds), width):
            chunk = seeds[first:first + width]
            slots = [(t, k) for t in range(len(tasks)) for k in range(len(chunk))]  # (task, seed in chunk) per env
            live = [envs[t * width + k] for t, k in slots]
            obs = np.stack([env.reset(seed=chunk[k])[0] for env, (_, k) in zip(live, slots)])
            running = np.ones(len(live), dtype=bool)
            while running.any():
                actions = np.asarray(act(obs[running]))
                chunks = actions if actions.ndim == 3 else actions[:, None]  # (B, K, 4)
                for row, i in enumerate(np.flatnonzero(running)):
                    t, k = slots[i]
                    for j, action in enumerate(chunks[row]):
                        # a chunk's inner actions: physics only, the image nobody reads is not rendered
                        step = live[i].step if j == len(chunks[row]) - 1 else live[i].step_without_render
                        obs[i], _, term, trunc, info = step(action)
                        solved[t, first + k] |= info["success"] > 0
                        running[i] = not (term or trunc)
                        if not running[i]:
                            break
    finally:
        for env in envs:
            env.close()
    return {task: float(solved[i].mean()) for i, task in enumerate(tasks)}


def expert_success(tasks: list[str], seeds: list[int], env_kwargs: dict[str, Any] | None = None) -> dict[str, float]:
    """The scripted experts' success rate per task on episodes reset with ``seeds`` (the ceiling BC imitates)."""
    out = {}
    for task in tasks:
        env, expert, wins = MetaWorldPixelEnv(task, **(env_kwargs or {})), expert_for(task), 0
        try:
            for s in seeds:
                env.reset(seed=s)
                end, solved = False, False
                while not end:
                    _, _, term, trunc, info = env.step(expert.get_action(env.state))
                    solved |= info["success"] > 0
                    end = term or trunc
                wins += solved
        finally:
            env.close()
        out[task] = wins / len(seeds)
    return out
