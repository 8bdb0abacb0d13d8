"""An environment with tools: a model turn that calls a tool gets the tool's output; any other turn goes to the task."""

from __future__ import annotations

from typing import Any

from m2flow.envs.text.base import TextEnv
from m2flow.rewards.tools.registry import ToolBox


class ToolEnv:
    """Wraps a task environment: calls (and malformed ones) are answered by ``toolbox`` with reward 0 and
    the episode going on; a turn without a call is the task's action. At most ``max_calls`` calls per
    episode are answered (None: no limit); one more truncates the episode. ``reset`` tells the model side
    which tools there are: ``info["tools"]``, the tools as function schemas (for a chat template)."""

    def __init__(self, env: TextEnv, toolbox: ToolBox, max_calls: int | None = None) -> None:
        self.env = env
        self.toolbox = toolbox
        self.max_calls = max_calls
        self.calls = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.calls = 0
        self.toolbox.seed(seed)  # the tools' latency draws follow the episode
        observation, info = self.env.reset(seed)
        return observation, {**info, "tools": self.toolbox.schemas()}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        fmt = self.toolbox.format
        if self.max_calls is not None and self.calls >= self.max_calls and fmt.parse(action).status != "none":
            return fmt.error(f"no calls left (at most {self.max_calls})"), 0.0, False, True, {"tool_outcome": "over_limit"}
        reply = self.toolbox.respond(action)
        if reply.outcome == "none":
            return self.env.step(action)
        self.calls += 1
        return reply.observation, 0.0, False, False, {"tool": reply.tool, "tool_outcome": reply.outcome}


def use_call_format(env: TextEnv, call_format: str) -> TextEnv:
    """``env`` reading tool calls in the registered format ``call_format`` (a ``ToolEnv``'s box is switched;
    an environment without tools is returned as it is)."""
    if isinstance(env, ToolEnv):
        env.toolbox.use_format(call_format)
    return env
