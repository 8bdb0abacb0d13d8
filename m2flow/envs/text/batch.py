"""Many text environments in one worker: reset and step those still running, and survive the broken ones.

``TextEnvBatch`` holds N environments, each playing one episode at a time. ``reset(seeds)`` starts every
episode; ``step({i: action})`` steps the environments named (each must be running) and returns what
each gave. An environment that raises, gives no answer within ``step_timeout_s`` (it is abandoned in
its thread and replaced by a fresh one from ``make`` at the next reset), or returns something that is
not ``(str, number, bool, bool, dict)`` (``reset``: ``(str, dict)``) does not stop the batch: its episode
ends with ``EnvStep.error`` set, and the failure is counted by kind in ``TextEnvStats``.
``check_health`` raises ``RunHealthError`` when failures pass ``max_error_rate`` of the calls made.
The calls of one ``reset`` or ``step`` run in turn on the batch's one long-lived thread (``DeadlineRunner``),
each under ``step_timeout_s`` from its own start: no thread is started per call.
With ``concurrent`` the calls of one ``reset`` or ``step`` run side by side, a thread each, so steps
that wait (a tool's latency, a remote environment) overlap. ``send`` and ``receive`` go further: steps are
started, and their answers taken back as they come, so the caller goes on with the episodes that have
answered while the others still wait (each step still under ``step_timeout_s``).
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from m2flow.envs.text.base import TextEnv
from m2flow.envs.text.registry import make_text_env
from m2flow.rewards.deadline import CallResult, DeadlineRunner, PendingCalls, call_all_with_deadline
from m2flow.runtime.cpu_clock import cpu_demand_s
from m2flow.runtime.errors import RunHealthError

logger = logging.getLogger(__name__)


@dataclass
class EnvStep:
    """What one environment gave for one call; ``error`` set means the episode ended by a failure."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def done(self) -> bool:
        """Whether the episode is over (by the task, a limit or a failure)."""
        return self.terminated or self.truncated or bool(self.error)


@dataclass
class TextEnvStats:
    """Counts of calls and failures by kind; add them up across batches."""

    resets: int = 0
    steps: int = 0
    raised: int = 0  # reset or step raised
    timeouts: int = 0  # reset or step gave nothing within the time limit
    bad_outputs: int = 0  # returned the wrong shape or types (a non-string observation...)
    replaced: int = 0  # environments rebuilt after a time-out
    episodes: int = 0  # episodes that ended by themselves (terminated or truncated)
    cpu_s: float = 0.0  # seconds the calls' threads wanted a core (``runtime.cpu_clock``), the rest of their time waited

    def __iadd__(self, other: TextEnvStats) -> TextEnvStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @property
    def failures(self) -> int:
        return self.raised + self.timeouts + self.bad_outputs

    def as_metrics(self, prefix: str = "env/") -> dict[str, float]:
        """The counts as metrics (``cpu_s``, a timing, is not one: the env worker reports it under ``time/``)."""
        return {prefix + f.name: float(getattr(self, f.name)) for f in fields(self) if f.name != "cpu_s"}


def _check_reset(value: Any) -> str:
    """'' when ``value`` is a valid reset result, else what is wrong with it."""
    if not isinstance(value, tuple) or len(value) != 2:
        return f"reset returned {type(value).__name__}, not (observation, info)"
    obs, info = value
    if not isinstance(obs, str):
        return f"reset returned a {type(obs).__name__} observation, not str"
    if not isinstance(info, Mapping):
        return f"reset returned a {type(info).__name__} info, not dict"
    return ""


def _check_step(value: Any) -> str:
    """'' when ``value`` is a valid step result, else what is wrong with it."""
    if not isinstance(value, tuple) or len(value) != 5:
        return f"step returned {type(value).__name__}, not (observation, reward, terminated, truncated, info)"
    obs, reward, terminated, truncated, info = value
    if not isinstance(obs, str):
        return f"step returned a {type(obs).__name__} observation, not str"
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        return f"step returned reward {reward!r}, not a finite number"
    if not isinstance(terminated, (bool, numbers.Integral)) or not isinstance(truncated, (bool, numbers.Integral)):
        return "step returned non-boolean terminated/truncated flags"
    if not isinstance(info, Mapping):
        return f"step returned a {type(info).__name__} info, not dict"
    return ""


class TextEnvBatch:
    """N environments stepped together; environment i plays one episode at a time."""

    def __init__(self, make: Callable[[], TextEnv], num_envs: int, name: str = "text env",
                 step_timeout_s: float | None = 10.0, max_error_rate: float = 0.0, concurrent: bool = False) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if not 0.0 <= max_error_rate <= 1.0:
            raise ValueError(f"max_error_rate must be in [0, 1], got {max_error_rate}")
        self.make, self.name = make, name
        self.step_timeout_s, self.max_error_rate = step_timeout_s, max_error_rate
        self.concurrent = concurrent
        """Step the environments side by side, a thread each (needs a `step_timeout_s`): for steps that wait
        (a tool's latency, a remote environment), not for environments that share global random state."""
        if concurrent and step_timeout_s is None:
            raise ValueError("concurrent stepping needs a step_timeout_s")
        self._runner = DeadlineRunner(step_timeout_s, name=f"{name} steps") if step_timeout_s is not None else None
        """The thread that runs one reset or step of the batch in turn, each call under the limit (not concurrent)."""
        self.envs: list[TextEnv] = [make() for _ in range(num_envs)]
        self.running = [False] * num_envs
        self._hung = [False] * num_envs
        self.stats = TextEnvStats()
        self.last_error = ""
        self._cpu_lock = threading.Lock()
        self._pending: PendingCalls | None = None
        """The steps started by ``send`` whose answers ``receive`` has not taken back."""

    @classmethod
    def from_registry(cls, env: str, num_envs: int, env_kwargs: Mapping[str, Any] | None = None,
                      tool_format: str = "tag", **kwargs: Any) -> TextEnvBatch:
        """A batch of the registered environment ``env`` built with ``env_kwargs``, its tools (a ``ToolEnv``'s)
        reading calls in ``tool_format``."""
        from m2flow.envs.text.tool_env import use_call_format

        settings = dict(env_kwargs or {})

        def make() -> TextEnv:
            return use_call_format(make_text_env(env, **settings), tool_format)

        make()  # fail here, on a bad name or setting, not later in a worker
        return cls(make, num_envs, name=env, **kwargs)

    def __len__(self) -> int:
        return len(self.envs)

    def _fail(self, i: int, kind: str, message: str) -> EnvStep:
        setattr(self.stats, kind, getattr(self.stats, kind) + 1)
        self.last_error = f"env {i} ({self.name}): {message}"
        logger.warning("%s; its episode ends here", self.last_error)
        self.running[i] = False
        return EnvStep("", error=message)

    def _call_all(self, calls: Mapping[int, tuple[Callable[..., Any], Any]], what: str) -> dict[int, CallResult | EnvStep]:
        """Each env's call under the time limit (side by side when `concurrent`): its result, or the
        failed `EnvStep` that ends its episode."""
        if self._runner is not None and not self.concurrent:  # in turn on one thread, each under its own limit
            items = list(calls.items())
            # The runner's clock read before and after the batch (two reads, not two per call): what the
            # calls wanted of a core; a batch with a hang ran partly on a fresh thread and is not counted.
            clocked = self._runner.run_all([(cpu_demand_s, ()), *((fn, (arg,)) for _, (fn, arg) in items),
                                            (cpu_demand_s, ())])
            results = clocked[1:-1]
            if all(r.status == "ok" for r in (clocked[0], clocked[-1])) and all(r.status != "timeout" for r in results):
                self.stats.cpu_s += max(0.0, clocked[-1].value - clocked[0].value)
        else:  # in this thread (no limit), or side by side, a thread each
            items = [(i, (self._cpu_counted(fn), arg)) for i, (fn, arg) in calls.items()]
            results = call_all_with_deadline([(fn, (arg,)) for _, (fn, arg) in items], self.step_timeout_s)
        return {i: self._outcome(i, result, what) for (i, _), result in zip(items, results)}

    def _outcome(self, i: int, result: CallResult, what: str) -> CallResult | EnvStep:
        """Env i's call as it ended: its result, or, when it hung or raised, the failed ``EnvStep`` that ends
        its episode (counted)."""
        if result.status == "timeout":
            self._hung[i] = True  # its thread may still run: never call this object again
            return self._fail(i, "timeouts", f"{what} gave no result within {self.step_timeout_s:g}s")
        if result.status == "error":
            return self._fail(i, "raised", f"{what} raised {result.error}")
        return result

    def _cpu_counted(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn``, adding the CPU its thread wanted during the call to ``stats.cpu_s`` (a tool's wait is not)."""
        def call(arg: Any) -> Any:
            t0 = cpu_demand_s()
            try:
                return fn(arg)
            finally:
                spent = cpu_demand_s() - t0
                with self._cpu_lock:
                    self.stats.cpu_s += spent
        return call

    def reset(self, seeds: Sequence[int | None]) -> list[EnvStep]:
        """Start an episode in every environment (seed i for env i): the first observations (reward 0)."""
        if len(seeds) != len(self.envs):
            raise ValueError(f"{len(seeds)} seeds for {len(self.envs)} environments")
        out = self.reset_some(dict(enumerate(seeds)))
        return [out[i] for i in range(len(self.envs))]

    def reset_some(self, seeds: Mapping[int, int | None]) -> dict[int, EnvStep]:
        """Start an episode in environment i with ``seeds[i]`` for each i given; the others go on as they are
        (partial rollouts keep unfinished episodes across iterations). The first observations (reward 0), by i."""
        for i in seeds:
            if self._pending is not None and not self._pending.drop(i):  # a step still out: its answer is dropped
                self._hung[i] = True
            if self._hung[i]:
                self.envs[i], self._hung[i] = self.make(), False
                self.stats.replaced += 1
            self.running[i] = True
        self.stats.resets += len(seeds)
        results = self._call_all({i: (self.envs[i].reset, seed) for i, seed in seeds.items()}, "reset")
        out = {}
        for i in seeds:
            result = results[i]
            if isinstance(result, CallResult) and (problem := _check_reset(result.value)):
                result = self._fail(i, "bad_outputs", problem)
            out[i] = result if isinstance(result, EnvStep) else EnvStep(result.value[0], info=dict(result.value[1]))
        return out

    def step(self, actions: Mapping[int, str]) -> dict[int, EnvStep]:
        """Step environment i with ``actions[i]`` for each i given (each must be running)."""
        self._check_steppable(actions)
        self.stats.steps += len(actions)
        results = self._call_all({i: (self.envs[i].step, action) for i, action in actions.items()}, "step")
        return {i: self._step_result(i, result) for i, result in results.items()}

    def send(self, actions: Mapping[int, str]) -> None:
        """Start stepping environment i with ``actions[i]`` for each i given (each running, none with a step
        out), a thread each; ``receive`` takes the answers back as they come."""
        if self.step_timeout_s is None:
            raise ValueError("stepping in the background needs a step_timeout_s")
        self._check_steppable(actions)
        if self._pending is None:
            self._pending = PendingCalls(self.step_timeout_s)
        self.stats.steps += len(actions)
        for i, action in actions.items():
            self._pending.start(i, self._cpu_counted(self.envs[i].step), action)

    def receive(self, wait: bool = True, linger_s: float = 0.0) -> dict[int, EnvStep]:
        """The answers of the steps ``send`` started that have come back (a step past ``step_timeout_s`` comes
        back failed), by environment; with ``wait``, when steps are out and none has answered, first wait for
        one, then for the others up to ``linger_s`` from the call."""
        if self._pending is None:
            return {}
        return {i: self._step_result(i, self._outcome(i, result, "step"))
                for i, result in self._pending.take(wait, linger_s).items()}

    def stepping(self) -> list[int]:
        """The environments with a step out (sent, its answer not received)."""
        return self._pending.out() if self._pending is not None else []

    def _check_steppable(self, actions: Mapping[int, str]) -> None:
        out = set(self.stepping())
        for i in actions:
            if not self.running[i]:
                raise ValueError(f"env {i} ({self.name}) is not running; reset it first")
            if i in out:
                raise ValueError(f"env {i} ({self.name}) has a step out; receive its answer first")

    def _step_result(self, i: int, result: CallResult | EnvStep) -> EnvStep:
        """What environment i's step gave, checked: its ``EnvStep`` (a failed one ends its episode)."""
        if isinstance(result, CallResult) and (problem := _check_step(result.value)):
            result = self._fail(i, "bad_outputs", problem)
        if isinstance(result, EnvStep):
            return result
        obs, reward, terminated, truncated, info = result.value
        step = EnvStep(obs, float(reward), bool(terminated), bool(truncated), dict(info))
        if step.done:
            self.running[i] = False
            self.stats.episodes += 1
        return step

    def stop(self, i: int) -> None:
        """End environment i's episode from outside (a turn or token budget ran out)."""
        self.running[i] = False

    def pop_stats(self) -> TextEnvStats:
        """The counts since the last call, and reset them."""
        stats, self.stats = self.stats, TextEnvStats()
        return stats

    def check_health(self, stats: TextEnvStats, where: str = "") -> None:
        """Raise ``RunHealthError`` when ``stats``' failures pass ``max_error_rate`` of its calls."""
        calls = stats.resets + stats.steps
        if not stats.failures or stats.failures <= self.max_error_rate * calls:
            return
        raise RunHealthError(
            f"{self.name}: {stats.failures} of {calls} environment calls failed{' ' + where if where else ''} "
            f"({stats.raised} raised, {stats.timeouts} timed out, {stats.bad_outputs} returned bad values), more "
            f"than max_error_rate={self.max_error_rate:g}; the last: {self.last_error}")
