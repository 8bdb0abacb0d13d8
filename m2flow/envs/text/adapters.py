"""Optional adapters: GEM environments (extra ``gem``) and reasoning-gym tasks (extra ``reasoning-gym``).

Both packages are imported only when such an environment is built; without them the error names the
extra to install. GEM environments already have this package's signature (``reset(seed)`` ->
``(observation, info)``, ``step(action)`` -> 5-tuple), so the adapter only builds them by GEM id (e.g.
``game:GuessTheNumber-v0``) and passes calls through; a reasoning-gym task is one question per episode,
scored by the task's own ``score_answer`` on the first turn.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from m2flow.envs.text.base import register_text_env


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or fail saying which extra of m2flow brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module!r} is not installed; it comes with m2flow's optional extra {extra!r}: "
                          f"pip install 'm2flow[{extra}]' ({exc})") from exc


class GemEnv:
    """A GEM environment by id; ``kwargs`` go to ``gem.make``. ``wrappers`` names GEM's own wrappers,
    comma-separated, applied in order (e.g. ``python_tool``: GEM's Python tool, code in
    ``<python>...</python>``, run in GEM's subprocess sandbox); wrappers that need a tokenizer are refused."""

    def __init__(self, env_id: str, wrappers: str = "", **kwargs: Any) -> None:
        require("requests", "gem")  # imported by gem without being declared as its dependency
        gem = require("gem", "gem")
        factory = require("gem.wrappers.wrapper_factory", "gem")
        self.env_id = env_id
        self.env = gem.make(env_id, **kwargs)
        for name in filter(None, (w.strip() for w in wrappers.split(","))):
            if name not in factory.WRAPPER_FACTORY or name in factory.TOKENIZER_REQUIRED:
                valid = sorted(set(factory.WRAPPER_FACTORY) - set(factory.TOKENIZER_REQUIRED))
                raise ValueError(f"unknown or unsupported GEM wrapper {name!r}; valid: {valid}")
            self.env = factory.WRAPPER_FACTORY[name](self.env)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed)
        return obs, dict(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, float(reward), bool(terminated), bool(truncated), dict(info)


register_text_env("gem")(GemEnv)


class ReasoningGymTask:
    """One question of a reasoning-gym task per episode (``reset(seed)``: the seed's question); the first
    turn is the answer, rewarded by the task's own scorer (in [0, 1])."""

    def __init__(self, task: str, **task_kwargs: Any) -> None:
        self.rg = require("reasoning_gym", "reasoning-gym")
        self.task, self.task_kwargs = task, task_kwargs
        self.dataset: Any = None
        self.entry: dict[str, Any] | None = None
        self.rg.create_dataset(task, size=1, seed=0, **task_kwargs)  # a bad name or setting fails here

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.dataset = self.rg.create_dataset(self.task, size=1, seed=0 if seed is None else seed, **self.task_kwargs)
        self.entry = self.dataset[0]
        return str(self.entry["question"]), {"answer": str(self.entry["answer"])}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.entry is None:
            raise RuntimeError("step before reset")
        score = float(self.dataset.score_answer(answer=action.strip(), entry=self.entry))
        return "", score, True, False, {"answer": str(self.entry["answer"])}


register_text_env("reasoning_gym")(ReasoningGymTask)
