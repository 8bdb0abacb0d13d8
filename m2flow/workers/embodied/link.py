"""How an env rank hands each pipeline stage's observations to the policy and gets actions back.

Two links behind one interface, chosen by placement:

- ``InlineLink``: the policy runs in the env's own process (env and rollout ranks on the same
  devices): a direct call, no message at all;
- ``CommLink``: the policy runs in a rollout rank elsewhere: one point-to-point message each way
  per stage and step, over the runtime's comm layer (a Unix socket on one node, with shared
  memory for large payloads; TCP across nodes). The stream between two ranks is ordered, so a
  message carries only the array itself.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from m2flow.runtime.trace import get_tracer
from m2flow.workers.embodied.inference import PolicyEngine


class StepLink(Protocol):
    """The env side of the env <-> policy exchange, one call pair per stage and step."""

    policy_s: float
    """seconds of policy inference spent in this process."""

    def send_obs(self, stage: int, obs: np.ndarray) -> None:
        """Hand stage ``stage``'s (n_k, *obs_shape) observations to the policy."""

    def recv_actions(self, stage: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The (n_k, *action_shape) actions for the observations last sent for ``stage``, and their (n_k,)
        log-probabilities under the weights that acted (None where the policy does not record them)."""


class InlineLink:
    """The policy is in this process: ``send_obs`` acts at once, ``recv_actions`` hands the result over."""

    def __init__(self, engine: PolicyEngine, source: int) -> None:
        self.engine = engine
        self.source = source
        self.policy_s = 0.0
        self._ready: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}

    def send_obs(self, stage: int, obs: np.ndarray) -> None:
        t0 = time.perf_counter_ns()
        self._ready[stage] = self.engine.act_scored([obs], [self.source])[0]
        dt = time.perf_counter_ns() - t0
        self.policy_s += dt * 1e-9
        tracer = get_tracer()
        if tracer.enabled:
            tracer.complete("act", t0, dt, cat="rollout", stage=stage)

    def recv_actions(self, stage: int) -> tuple[np.ndarray, np.ndarray | None]:
        return self._ready.pop(stage)


class CommLink:
    """The policy is in rollout rank ``rank`` of ``group``: ordered messages through ``worker``'s comm."""

    def __init__(self, worker: Any, group: str, rank: int) -> None:
        self.comm = worker.comm
        self.group = group
        self.rank = rank
        self.policy_s = 0.0

    def send_obs(self, stage: int, obs: np.ndarray) -> None:
        self.comm.send(obs, self.group, self.rank)

    def recv_actions(self, stage: int) -> tuple[np.ndarray, np.ndarray | None]:
        msg = self.comm.recv(self.group, self.rank)  # the actions alone, or (actions, log-probs)
        return msg if isinstance(msg, tuple) else (msg, None)
