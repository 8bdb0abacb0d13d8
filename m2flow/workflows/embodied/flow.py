"""The embodied workflow's live system: env, rollout and actor groups, and the run's counters.

The plan decides how one iteration runs:

- env and rollout ranks on the same devices (collocated) are fused: the policy runs inside the env
  process, with no message per step; otherwise each stage's observations and actions travel
  between env and rollout ranks, and with ``pipeline_stages`` K > 1 (a plan setting) one stage
  simulates while the next is being inferred (elastic pipelining);
- components sharing devices take turns under the device lock, offloading when configured
  (context switching); disjoint ones simply overlap;
- the actor consumes the trajectories as soon as the env ranks send them, data-parallel over its ranks;
- with ``max_staleness`` s > 0 the env ranks collect iterations k + 1 .. k + s with the weights they
  hold while the actor trains on iteration k; the weights go to the policy copies between
  collections, and every trajectory carries the version that produced it.

Which iteration collects with which weights is fixed by the loop, not by timing: the collection of
iteration j starts at step max(0, j - s) with the weights of that many trained iterations, so a run
is reproducible and every sample is at most s iterations old.
"""

from __future__ import annotations

import importlib
import math
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from m2flow.driver.checkpoints import CheckpointError
from m2flow.runtime.waiting import gather
from m2flow.driver.workflow import Flow, Launch
from m2flow.planner import Plan
from m2flow.runtime.executors import Executor, Handle
from m2flow.workers.embodied.messages import InteractStats
from m2flow.workflows.embodied.config import EmbodiedConfig
from m2flow.workflows.embodied.graph import COMPONENTS
from m2flow.workflows.embodied.plan import env_spaces
from m2flow.workflows.embodied.settings import EmbodiedRun, WorkerSettings


def _gather(handles: dict[str, Handle], timeout: float | None, what: str = "") -> dict[str, list[Any]]:
    """Results of every handle by name; the first failure anywhere raises at once."""
    return dict(zip(handles, gather(list(handles.values()), timeout, what)))


class EmbodiedFlow(Flow):
    """The launched system of one run attempt (the driver's ``Flow``)."""

    def __init__(self, workflow: Any, plan: Plan, executor: Executor, run: Launch, *, settings: EmbodiedRun,
                 workers: WorkerSettings) -> None:
        """``settings``: what the flow reads of the config; ``workers``: the workers' settings from the
        groups' names and one env's spaces (``worker_settings`` with the config and the plan bound)."""
        self.settings, self.plan = settings, plan
        self.timeout = settings.iteration_timeout_s
        self.mode = plan.mode
        self.fused = plan.fused("rollout")
        self.max_staleness: int = plan.settings["max_staleness"]
        # iteration -> the calls of its collection still to be waited for (and the weight sync before it)
        self._pending: dict[int, dict[str, Handle | None]] = {}
        self._next_collect = run.start  # the first iteration whose collection has not started
        self._synced: int | None = None  # the version the policy copies hold (staleness > 0)
        self._sync_s = 0.0
        ranks = {c: plan[c].world_size for c in COMPONENTS}
        self.env_ranks = ranks["env"]
        for module in settings.imports:  # custom env ids, for the probe env built here
            importlib.import_module(module)
        spaces = env_spaces(replace(settings.env, num_groups=plan.settings["pipeline_stages"], seed=settings.seed))
        if settings.policy.init_from is not None:  # a file that does not fit fails here, before any worker starts
            from m2flow.models.policies import build_policy

            build_policy(*spaces, settings.policy)
        self.iterations = settings.iterations
        self.batch = settings.batch_size
        self.progress_total = self.iterations * self.batch * settings.policy.action_chunk  # env steps
        self.launched = workflow.launch_plan(plan, executor, run, lambda wiring: workers(dict(wiring.names), spaces))
        self.names = self.launched.names
        self.env, self.actor = self.launched["env"], self.launched["actor"]
        self.rollout = None if self.fused else self.launched["rollout"]  # fused: the env ranks run the policy
        self.policy_holder = self.env if self.fused else self.rollout
        holder = plan["rollout"].host
        self.weight_targets = [(self.names[holder], list(range(ranks[holder])))]
        self.env_steps = 0
        self._steps = 0  # env steps of the iteration last finished
        self.episodes: list[tuple[int, float]] = []
        self.recent: deque[float] = deque(maxlen=settings.return_window)
        self._deltas: list | None = None
        self.description = f"{settings.env.env_id}, {self.mode}{', fused' if self.fused else ''}"
        if run.checkpoint is not None and run.state is not None:
            self.load(run.checkpoint, run.state)

    # -- the named steps of an iteration ---------------------------------------------------------
    def sync_weights(self) -> float:
        """Stream the actor's weights to every policy copy (rollout ranks, or fused env ranks)."""
        t0 = time.perf_counter()
        _gather({"actor": self.actor.send_weights(self.weight_targets),
                 "holder": self.policy_holder.receive_weights(self.names["actor"], 0)}, self.timeout, "a weight sync")
        return time.perf_counter() - t0

    def start(self, it: int, horizon: int) -> None:
        """Start the collections of iterations up to ``horizon`` not yet started.

        Staleness 0: the weights are synced (and waited for), then iteration ``it`` collects, as
        in synchronous PPO. Otherwise the weights of version ``it`` (iterations trained) are queued
        to the policy copies behind the collections already running, and each new collection is
        queued behind them: the env ranks never wait for the actor's update, only for its weights.
        """
        self._sync_s = 0.0
        if self.max_staleness == 0:
            self._sync_s = self.sync_weights()
            self._pending[it] = {"env": self.env.interact(it, self.pending_norm_deltas(), it), "rollout": self.act(it)}
            self._next_collect = it + 1
            return
        for j in range(max(self._next_collect, it), horizon + 1):
            handles: dict[str, Handle | None] = {}
            if self._synced != it:
                handles["sync_actor"] = self.actor.send_weights(self.weight_targets, it)
                handles["sync"] = self.policy_holder.receive_weights(self.names["actor"], 0)
                self._synced = it
            handles["env"] = self.env.interact(j, self.pending_norm_deltas(), self._synced)
            handles["rollout"] = self.act(j)
            self._pending[j] = handles
        self._next_collect = max(self._next_collect, horizon + 1)

    def in_flight(self, it: int) -> bool:
        """Whether a collection past iteration ``it`` has started."""
        return self._next_collect > it + 1

    def act(self, iteration: int) -> Handle | None:
        """The rollout ranks' serving call for one iteration (None: the env ranks run the policy)."""
        return None if self.fused else self.rollout.act(iteration)

    def pending_norm_deltas(self) -> list | None:
        """Every env rank's statistics additions of the last iteration, to merge before this one."""
        deltas, self._deltas = self._deltas, None
        return deltas

    def finish(self, it: int) -> dict[str, float]:
        """Wait for iteration ``it``'s collection while the actor trains on it; the iteration's metrics."""
        handles = {**self._pending.pop(it), "actor": self.actor.train(it)}
        outcome = _gather({k: h for k, h in handles.items() if h is not None}, self.timeout, f"iteration {it}")
        stats: list[InteractStats] = outcome["env"]
        if self.settings.sync_normalization and self.env_ranks > 1:
            self._deltas = [s.norm_delta for s in stats]
        self._steps = sum(s.steps for s in stats)
        self.env_steps += self._steps
        returns = [r for s in stats for r in s.episode_returns]
        lengths = [n for s in stats for n in s.episode_lengths]
        self.episodes.extend((self.env_steps, r) for r in returns)
        self.recent.extend(returns)
        metrics: dict[str, float] = dict(outcome["actor"][0])
        metrics.update({
            "env/total_steps": float(self.env_steps),
            "env/episodes": float(len(returns)),
            "env/errors_count": float(sum(s.errors for s in stats)),
            "time/weight_sync_s": max(outcome["sync"]) if "sync" in outcome else self._sync_s,
            "time/env_busy_s": max(s.busy_s for s in stats),
            "time/env_wait_s": max(s.wait_s for s in stats),
            "time/env_wall_s": max(s.wall_s for s in stats),
            "time/env_lock_wait_s": max(s.lock_wait_s for s in stats),
        })
        if returns:
            metrics["env/episode_return"] = sum(returns) / len(returns)
            metrics["env/episode_length"] = sum(lengths) / len(lengths)
        if self.recent:
            metrics["env/episode_return_recent"] = sum(self.recent) / len(self.recent)
        successes = [x for s in stats for x in s.successes if not math.isnan(x)]
        if successes:
            metrics["env/success_rate"] = sum(successes) / len(successes)
        if self.fused:
            metrics["time/rollout_busy_s"] = max(s.policy_s for s in stats)
        else:
            metrics["time/rollout_busy_s"] = max(r["busy_s"] for r in outcome["rollout"])
            metrics["time/rollout_wait_s"] = max(r["wait_s"] for r in outcome["rollout"])
        return metrics

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        return {"time/iteration_s": seconds, "time/env_steps_per_s": self._steps / seconds}

    def progress(self) -> int:
        """Env steps so far: metrics are logged at step = env steps."""
        return self.env_steps

    def evaluate(self) -> dict[str, float]:
        """Deterministic episodes of the current policy with env rank 0's statistics, in this process."""
        from m2flow.workers.embodied.evaluate import evaluate_policy

        weights, norm = gather([self.actor.state_dict(ranks=[0]), self.env.normalizer_state(ranks=[0])],
                               self.timeout, "an evaluation")
        run = self.settings
        return evaluate_policy(run.env, run.policy, weights[0], norm[0], run.eval_episodes, seed=run.seed)

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, path: Path) -> dict[str, Any]:
        """Actor (weights, optimizer, shuffling), env ranks (envs, statistics), noise generators; the counters."""
        done = self._next_collect
        if any(j >= done for j in self._pending):
            raise RuntimeError(f"checkpoint: the collection of iteration {max(self._pending)} has started "
                               "(the loop drains before a checkpoint)")
        handles = {"actor": self.actor.save_checkpoint(str(path)), "env": self.env.save_checkpoint(str(path))}
        if not self.fused:
            handles["rollout"] = self.rollout.save_checkpoint(str(path))
        saved = _gather(handles, self.timeout, "a checkpoint")
        return {"env_steps": self.env_steps, "actor": saved["actor"][0],  # counters such as skipped updates in a row
                "episodes": self.episodes, "recent": list(self.recent), "norm_deltas": self._deltas,
                "env_ranks": self.env_ranks, "fused": self.fused}

    def load(self, path: Path, state: dict[str, Any]) -> None:
        """Restore every worker and the counters from a checkpoint."""
        if state["env_ranks"] != self.env_ranks:
            raise CheckpointError(f"resume: {path} was written by {state['env_ranks']} env ranks, "
                                  f"this placement has {self.env_ranks}")
        handles = {"actor": self.actor.load_checkpoint(str(path), state.get("actor")),
                   "env": self.env.load_checkpoint(str(path))}
        if not self.fused:
            if state["fused"]:
                raise CheckpointError(f"resume: {path} holds no rollout ranks' generators (written by a fused plan)")
            handles["rollout"] = self.rollout.load_checkpoint(str(path))
        _gather(handles, self.timeout, "loading a checkpoint")
        self.env_steps = state["env_steps"]
        self.episodes = [(int(n), float(r)) for n, r in state["episodes"]]
        self.recent.extend(state["recent"])
        self._deltas = state["norm_deltas"]

    def summary(self, history: list[dict[str, float]]) -> str:
        last = history[-1] if history else {}
        shown = ", ".join(f"{k}={last[k]:.4g}" for k in ("env/episode_return_recent", "time/env_steps_per_s",
                                                         "eval/return") if k in last)
        return f"embodied ({self.mode}): {len(history)} iteration(s); {shown or 'no iterations run'}"
