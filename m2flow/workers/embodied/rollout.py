"""``RolloutWorker``: policy inference for the env ranks it serves, one pipeline stage at a time.

Rollout rank r serves env ranks r, r + R, r + 2R, ... (R rollout ranks). For every step and stage it
takes that stage's observations from each of its env ranks, acts on all of them in one forward
pass (the micro-batch), and sends each env rank its actions. Messages between a pair of ranks are
ordered, so stage k of step t is always the next message from each env rank.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from m2flow.runtime.trace import get_tracer, trace_category
from m2flow.runtime.worker import Worker
from m2flow.workers.embodied.inference import PolicyEngine
from m2flow.workers.embodied.settings import EmbodiedRolloutSettings
from m2flow.workers.state_file import load_state, save_state


def served_env_ranks(rollout_rank: int, rollout_ranks: int, env_ranks: int) -> list[int]:
    """The env ranks rollout rank ``rollout_rank`` of ``rollout_ranks`` serves."""
    return list(range(rollout_rank, env_ranks, rollout_ranks))


class RolloutWorker(Worker):
    """Acts for its env ranks on every stage of every step of an iteration."""

    def __init__(self, *, settings: EmbodiedRolloutSettings) -> None:
        s = settings
        self.env_group = s.env_group
        self.sources = served_env_ranks(self.rank, self.world_size, s.env_ranks)
        self.stages = s.stages
        self.T = s.rollout_steps
        self.shares_devices = s.shares_devices
        self.offload_policy = s.offload
        self.engine = PolicyEngine(s.obs_space, s.action_space, s.policy, s.seed, self.sources,
                                   device=self.torch_device)

    @trace_category("rollout")
    def act(self, iteration: int) -> dict[str, float]:
        """Serve T steps x K stages for every source; returns busy and wait seconds."""
        if not self.sources:
            return {"busy_s": 0.0, "wait_s": 0.0}
        if self.shares_devices:
            with self.device_turn(offload_after=self.offload_policy):
                return self._serve()
        return self._serve()

    def _serve(self) -> dict[str, float]:
        comm, group, sources, engine = self.comm, self.env_group, self.sources, self.engine
        tracer = get_tracer()
        traced = tracer.enabled
        busy = wait = 0
        for _ in range(self.T):
            for k in range(self.stages):
                t0 = time.perf_counter_ns()
                obs = [comm.recv(group, s) for s in sources]
                t1 = time.perf_counter_ns()
                for s, (a, lp) in zip(sources, engine.act_scored(obs, sources)):
                    comm.send(a if lp is None else (a, lp), group, s)
                t2 = time.perf_counter_ns()
                wait += t1 - t0
                busy += t2 - t1
                if traced:
                    tracer.complete("wait_obs", t0, t1 - t0, cat="wait_channel", stage=k)
                    tracer.complete("act", t1, t2 - t1, cat="rollout", stage=k)
        return {"busy_s": busy * 1e-9, "wait_s": wait * 1e-9}

    @trace_category("weight_sync")
    def receive_weights(self, src_group: str, src_rank: int) -> float:
        """Receive the actor's weights into this rank's policy copy; returns the seconds it took."""
        from m2flow.runtime.comm.weights import recv_weights

        t0 = time.perf_counter()
        recv_weights(self.comm, src_group, src_rank, into=self.engine.weights)
        self.engine.weights_changed()
        return time.perf_counter() - t0

    def offload(self) -> None:
        self.engine.to("cpu")

    def onload(self) -> None:
        self.engine.to(self.torch_device)

    def save_checkpoint(self, directory: str) -> str:
        """Write the action-noise generators of this rank's sources."""
        path = Path(directory) / f"rollout_rank{self.rank}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_state(self.engine.rng_state(), path)
        return str(path)

    def load_checkpoint(self, directory: str) -> None:
        self.engine.load_rng_state(load_state(Path(directory) / f"rollout_rank{self.rank}.pt"))

    def sources_served(self) -> Sequence[int]:
        return list(self.sources)
