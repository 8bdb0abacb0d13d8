"""Tools by name, and the ``ToolBox`` that answers a model turn's call under a time limit, with counts.

``TOOLS`` maps a name to a factory (``TOOLS.add("search", make_search)``; duplicates raise, unknown names
list the valid ones). ``ToolBox.respond(text)`` turns one model turn into the observation the model
sees next: the tool's output as ``<result>...</result>``, or ``<error>...</error>`` for a malformed call,
an unknown tool, a tool that raised or one that missed its time limit; each kind is counted in
``ToolStats``. Nothing the model writes makes it raise. The box reads calls in one format
(``formats.py``: ``tag`` by default, ``hermes`` for chat templates' function calls, whose arguments it
checks against the tool's schema: a call that does not fit is ``malformed``).

In-process tools run on the box's one long-lived deadline thread, except when the box is called from a
thread that is itself under a deadline (an environment's step in a ``TextEnvBatch``): there the call runs
in place, since that deadline already abandons a hung call, and a second hand-off per call would cost more
than a cheap tool; a call that returns after ``timeout_s`` still counts as timed out, as on the thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from m2flow.algorithms.registry import Registry
from m2flow.rewards.deadline import CallResult, DeadlineRunner, call_with_deadline, under_deadline
from m2flow.rewards.tools.base import Tool, ToolTimeout
from m2flow.rewards.tools.calculator import Calculator
from m2flow.rewards.tools.formats import CALL_FORMATS, CallFormat
from m2flow.rewards.tools.latency import ToolLatency, parse_latency
from m2flow.rewards.tools.python import PythonTool
from m2flow.rewards.tools.schema import ArgumentError, argument_from, function_schema

logger = logging.getLogger(__name__)

TOOLS: Registry[Callable[..., Tool]] = Registry("tool")
"""Tool name -> factory of the tool (keyword arguments are the tool's own settings)."""
TOOLS.add("calculator", Calculator)
TOOLS.add("python", PythonTool)

CallOutcome = Literal["none", "ok", "malformed", "unknown", "error", "timeout"]
LatencySpec = ToolLatency | Sequence[float] | Mapping[str, Any] | None
"""A tool latency as configs give it: ``[low, high]`` seconds (uniform), a ``{dist: ...}`` mapping, or none."""


@dataclass
class ToolStats:
    """Counts of what model turns held and how their calls ended; add them up across batches."""

    turns: int = 0  # model turns looked at
    calls: int = 0  # well-formed calls to a known tool
    ok: int = 0  # calls that returned an output
    malformed: int = 0  # turns with a malformed call (an error observation)
    unknown: int = 0  # calls to a tool that is not in the box
    errors: int = 0  # calls whose tool raised
    timeouts: int = 0  # calls past the time limit
    seconds: float = 0.0  # wall time spent in tools

    def __iadd__(self, other: ToolStats) -> ToolStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @property
    def failures(self) -> int:
        """Turns whose call produced an error observation."""
        return self.malformed + self.unknown + self.errors + self.timeouts

    def as_metrics(self, prefix: str = "tool/") -> dict[str, float]:
        """Flat metric dict, e.g. {"tool/malformed": 0.0, ...}."""
        return {prefix + f.name: float(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class ToolReply:
    """The answer to one model turn: the outcome and, unless the turn held no call, the observation text."""

    outcome: CallOutcome
    observation: str = ""
    tool: str = ""


class ToolBox:
    """The tools one environment offers, each call under ``timeout_s`` (in-process tools: a thread deadline).

    With ``latency_s = (low, high)`` every call to a tool first waits a time drawn uniformly from
    ``[low, high]`` seconds, outside the time limit: a stand-in for a tool that answers over a network
    (a search engine, a remote sandbox); a ``ToolLatency`` or its mapping form (``latency.py``) draws from
    another distribution, e.g. a heavy-tailed one. The draws come from a generator seeded by ``seed(n)`` (a
    ``ToolEnv`` calls it with each episode's seed, so an episode's waits do not depend on where it runs).
    """

    def __init__(self, tools: Sequence[Tool], timeout_s: float = 5.0,
                 latency_s: LatencySpec = None, call_format: str = "tag") -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        try:
            self.latency_s = parse_latency(latency_s)
        except ValueError as e:
            raise ValueError(f"latency_s: {e}") from None
        self._latency_rng = np.random.default_rng(0)
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"tool {tool.name!r} is in the box twice")
            self.tools[tool.name] = tool
        self.timeout_s = timeout_s
        self.format: CallFormat = CALL_FORMATS.get(call_format)
        """How calls are read and replies written (``use_format`` changes it)."""
        self.stats = ToolStats()
        self._runner = DeadlineRunner(timeout_s, name="tool calls")
        """One long-lived thread for the in-process tools' calls (started at the first call), not one per call."""

    @classmethod
    def from_names(cls, names: Sequence[str], timeout_s: float = 5.0, latency_s: LatencySpec = None,
                   call_format: str = "tag", **settings: dict[str, Any]) -> ToolBox:
        """A box of registered tools by name; ``settings[name]`` are keyword arguments of that tool's factory."""
        unknown = set(settings) - set(names)
        if unknown:
            raise ValueError(f"settings for tools not in the box: {sorted(unknown)}")
        return cls([TOOLS.get(n)(**settings.get(n, {})) for n in names], timeout_s=timeout_s, latency_s=latency_s,
                   call_format=call_format)

    def use_format(self, call_format: str) -> None:
        """Read calls and write replies in the registered format ``call_format`` from now on."""
        self.format = CALL_FORMATS.get(call_format)

    def schemas(self) -> list[dict[str, Any]]:
        """The tools as function schemas, for a chat template's ``tools=`` (``schema.function_schema``)."""
        return [function_schema(t) for t in self.tools.values()]

    def seed(self, seed: int | None) -> None:
        """Seed the latency draws (None: from the operating system's entropy)."""
        self._latency_rng = np.random.default_rng(seed)

    def latency(self) -> float:
        """The wait of the next call in seconds (0.0 without ``latency_s``)."""
        if self.latency_s is None:
            return 0.0
        return self.latency_s.draw(self._latency_rng)

    def describe(self) -> str:
        """One line per tool, for a prompt."""
        return "\n".join(f"{t.name}: {t.description}" for t in self.tools.values())

    def respond(self, text: str) -> ToolReply:
        """The reply to one model turn (``outcome`` ``none`` when it holds no call: an answer, not a call)."""
        self.stats.turns += 1
        fmt = self.format
        parsed = fmt.parse(text)
        if parsed.status == "none":
            return ToolReply("none")
        if parsed.status == "malformed":
            self.stats.malformed += 1
            return ToolReply("malformed", fmt.error(f"malformed call: {parsed.error}"))
        tool = self.tools.get(parsed.name)
        if tool is None:
            self.stats.unknown += 1
            valid = ", ".join(sorted(self.tools)) or "none"
            return ToolReply("unknown", fmt.error(f"unknown tool {parsed.name!r}; tools: {valid}"), parsed.name)
        argument = parsed.argument
        if parsed.arguments is not None:
            try:
                argument = argument_from(tool, parsed.arguments)
            except ArgumentError as e:
                self.stats.malformed += 1
                return ToolReply("malformed", fmt.error(f"malformed call: {e}"), tool.name)
        self.stats.calls += 1
        start = time.perf_counter()
        wait = self.latency()
        if wait > 0.0:
            time.sleep(wait)
        began = time.perf_counter()  # the time limit is the tool's, the latency is not part of it
        if tool.isolated or under_deadline():  # it kills its own process at its limit / the caller's deadline holds
            result = call_with_deadline(tool, argument)
            if not tool.isolated and result.status == "ok" and time.perf_counter() - began > self.timeout_s:
                result = CallResult("timeout", error=f"no result within {self.timeout_s:g}s")
        else:
            result = self._runner.run_all([(tool, (argument,))])[0]
        self.stats.seconds += time.perf_counter() - start
        if result.status == "timeout" or isinstance(result.exception, ToolTimeout):
            self.stats.timeouts += 1
            return ToolReply("timeout", fmt.error(f"{tool.name} timed out"), tool.name)
        if result.status == "error":
            self.stats.errors += 1
            logger.debug("tool %s raised: %s", tool.name, result.error)
            return ToolReply("error", fmt.error(f"{tool.name} failed: {result.error}"), tool.name)
        return self._ok(tool.name, result.value)

    def _ok(self, name: str, value: Any) -> ToolReply:
        if not isinstance(value, str):
            self.stats.errors += 1
            return ToolReply("error", self.format.error(f"{name} returned {type(value).__name__}, not text"), name)
        self.stats.ok += 1
        return ToolReply("ok", self.format.result(value), name)

    def pop_stats(self) -> ToolStats:
        """The counts since the last call, and reset them."""
        stats, self.stats = self.stats, ToolStats()
        return stats

    def close(self) -> None:
        """Release the tools' resources (sandbox processes, the deadline thread)."""
        self._runner.close()
        for tool in self.tools.values():
            close = getattr(tool, "close", None)
            if close is not None:
                close()
