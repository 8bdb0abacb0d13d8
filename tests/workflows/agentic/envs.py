"""Environments that misbehave on purpose, and a generation backend that writes malformed tool calls, for the
agentic workflow's tests (imported through ``env.imports``, so env workers in other processes register them too)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from m2flow.backends.generation.base import register_generation_backend
from m2flow.envs.text import register_text_env
from m2flow.envs.text.guess import GuessNumber
from tests.workers.agentic.scripted import ScriptedBackend


@register_text_env("test_faulty")
class Faulty(GuessNumber):
    """Guess-the-number whose second step misbehaves in one episode of ``every`` seeds: ``fault`` is
    'raise', 'hang' (sleeps ``hang_s``) or 'bad' (a non-string observation)."""

    def __init__(self, fault: str = "raise", every: int = 2, hang_s: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fault, self.every, self.hang_s = fault, every, hang_s
        self.seed = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.seed = int(seed or 0)
        return super().reset(seed)

    def step(self, action: str) -> Any:
        out = super().step(action)
        if self.turns == 2 and self.seed % self.every == 0:
            if self.fault == "raise":
                raise RuntimeError("the environment broke")
            if self.fault == "hang":
                time.sleep(self.hang_s)
            if self.fault == "bad":
                return (123, *out[1:])
        return out


@register_text_env("test_dies_once")
class DiesOnce(GuessNumber):
    """Guess-the-number whose process kills itself (SIGKILL; ``hang_s`` > 0: sleeps that long instead) at the
    first step with a seed of at least ``from_seed``, once per ``marker`` file (the first process to create it)."""

    def __init__(self, marker: str = "", from_seed: int = 0, hang_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker, self.from_seed, self.hang_s, self.seed = marker, from_seed, hang_s, 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.seed = int(seed or 0)
        return super().reset(seed)

    def step(self, action: str) -> Any:
        if self.marker and self.seed >= self.from_seed:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                if self.hang_s:
                    time.sleep(self.hang_s)
                else:
                    os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


def marker_pid(marker: str) -> int:
    """The pid of the process that killed itself."""
    return int(Path(marker).read_text())


@register_generation_backend("test_malformed_caller")
class MalformedCaller(ScriptedBackend):
    """Writes a call without ``NAME:`` (malformed) first, then a wrong answer once the error is read."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, lambda context: "0" if "<error>" in context
                         else "<tool>calculator " + context.split("=")[0] + "</tool>")

    @classmethod
    def from_options(cls, model_path: str, options: Any) -> MalformedCaller:
        from m2flow.models.tokenizer import load_tokenizer

        return cls(load_tokenizer(model_path))

    def load_weights(self, state_dict: Any) -> None:
        """Its turns are scripted: weights change nothing."""

    def offload(self) -> None:
        pass

    def onload(self) -> None:
        pass


@register_generation_backend("test_hermes_caller")
class HermesCaller(MalformedCaller):
    """Calls the calculator in the hermes form (``<tool_call>{json}</tool_call>``) on the chat-rendered problem,
    then copies the tool's result: every episode solved, through the chat template."""

    def __init__(self, tokenizer: Any) -> None:
        import json

        def script(context: str) -> str:
            if "<tool_response>\n" in context:
                return context.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
            problem = context.rsplit("user\n", 1)[1].split("=")[0]
            return f'<tool_call>{json.dumps({"name": "calculator", "arguments": {"expression": problem}})}</tool_call>'

        ScriptedBackend.__init__(self, tokenizer, script)


@register_text_env("test_turns")
class TurnsBySeed:
    """An episode of ``1 + seed % spread`` turns whatever the model writes (reward 1 at its end), each step taking
    ``step_s`` seconds (a slow tool), or ``slow_s`` in the episodes whose seed is a multiple of ``slow_every``:
    groups of very different lengths, for partial rollouts."""

    def __init__(self, spread: int = 4, step_s: float = 0.0, slow_s: float = 0.0, slow_every: int = 0) -> None:
        self.spread, self.step_s, self.left = spread, step_s, 0
        self.slow_s, self.slow_every, self.wait_s = slow_s, slow_every, step_s

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.left = 1 + int(seed or 0) % self.spread
        slow = self.slow_every and int(seed or 0) % self.slow_every == 0
        self.wait_s = self.slow_s if slow else self.step_s
        return "go:", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        time.sleep(self.wait_s)
        self.left -= 1
        return ("on:", 0.0, False, False, {}) if self.left > 0 else ("", 1.0, True, False, {})
