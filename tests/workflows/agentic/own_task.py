"""A task of a user's own for the agentic tests: its environment and teacher as the source of a module the
tests write to a temporary directory and name in ``env.imports`` (as a user would), and the config of a run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from m2flow.config import from_dict
from m2flow.config.convert import set_dotted
from m2flow.workflows.agentic.config import AgenticConfig

MODULE = "own_lookup_task"
"""The name the module is imported by (its file lies in the test's temporary directory)."""

SOURCE = """
\"\"\"Fetch records with a tool, then deliver the one asked for: ``[[LOOKUP: K]]`` fetches record K, ``ANSWER: K``
delivers K. A delivery before any fetch is refused (the episode fails); so does running out of turns.\"\"\"

import random
import re

from m2flow.data.teachers import Demonstration, TeachRequest, register_teacher
from m2flow.envs.text import register_text_env

KEYS = "ABCDEFGH"
LOOKUP = re.compile(r"\\s*\\[\\[LOOKUP: ([A-Z])\\]\\]\\s*")
ANSWER = re.compile(r"\\s*ANSWER: ([A-Z])\\s*")


@register_text_env("own_lookup")
class Lookup:
    \"\"\"One of ``keys`` records is asked for; the tool fetches any of them, one a turn.\"\"\"

    def __init__(self, keys=4, max_turns=3, split="train"):
        self.keys, self.max_turns, self.split = KEYS[:keys], max_turns, split

    def reset(self, seed=None):
        self.target = random.Random(f"{self.split}/{seed}").choice(self.keys)
        self.fetched, self.turns = set(), 0
        return f"Fetch {self.target}.", {}

    def step(self, action):
        self.turns += 1
        out_of_turns = self.turns >= self.max_turns
        lookup, answer = LOOKUP.fullmatch(action), ANSWER.fullmatch(action)
        if answer:
            won = answer.group(1) == self.target and bool(self.fetched)
            return "", float(won), True, False, {"won": won}
        if lookup and lookup.group(1) in self.keys:
            self.fetched.add(lookup.group(1))
            return f" {lookup.group(1)} OK ", 0.0, False, out_of_turns, {"tool_calls": 1}
        return " ERROR: [[LOOKUP: K]] or ANSWER: K ", 0.0, False, out_of_turns, {}


@register_teacher("own_lookup")
def teacher(request: TeachRequest) -> list[Demonstration]:
    \"\"\"Fetches the record asked for and delivers it, but in ``skip_rate`` of its episodes delivers without
    fetching (and fails).\"\"\"
    skip_rate = request.options.get("skip_rate", 0.5)
    env = Lookup(**request.env_kwargs)
    rng = random.Random(request.seed)
    demos = []
    for k in range(request.count):
        prompt, _ = env.reset(seed=request.seed * 1_000_003 + k)
        answer = f"ANSWER: {env.target}"
        if rng.random() < skip_rate:
            demos.append(Demonstration(prompt, (answer,), "skip", False))
            continue
        call = f"[[LOOKUP: {env.target}]]"
        demos.append(Demonstration(prompt, (call, env.step(call)[0], answer), "lookup", True))
    return demos
"""


def write_module(directory: Path) -> str:
    """Write the task's module into ``directory``, put it on the import path, and return its name."""
    (directory / f"{MODULE}.py").write_text(SOURCE)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    return MODULE


def own_config(tmp_path: Path, **overrides: Any) -> AgenticConfig:
    """A run on the lookup task from a tiny model warm-started by its teacher; ``overrides`` are dotted keys."""
    data: dict[str, Any] = {
        "placement": "local", "run_dir": str(tmp_path / "run"), "steps": 10, "seed": 0, "eval_every": 10,
        "eval_episodes": 200, "metrics": {"sinks": ["jsonl"]},
        "model": {"path": str(tmp_path / "model"), "create_tiny": True,
                  "warm_start": {"steps": 200, "batch_size": 32, "lr": 3e-3, "threads": 1,
                                 "teacher_kwargs": {"skip_rate": 0.5}}},
        "env": {"name": "own_lookup", "kwargs": {"keys": 2}, "eval_kwargs": {"split": "test"}, "imports": [MODULE]},
        "episodes": {"groups_per_step": 16, "group_size": 4},
        "rollout": {"max_turns": 3, "max_tokens": 64, "max_turn_tokens": 14, "stop": ["]]"],
                    "eval_temperature": 1.0},
        "actor": {"micro_batch_size": 32, "optim": {"lr": 1e-3}},
        "algorithm": {"adv_estimator": "grpo", "old_logprobs": "rollout"},
    }
    return from_dict(AgenticConfig, set_dotted(data, overrides))
