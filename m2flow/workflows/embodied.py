"""The embodied RL workflow (``workflow: embodied``): the macro loop, and what launches it.

``train_loop`` is the whole algorithm as a short sequence of named steps. It is the same for every
placement; the plan decides how it runs:

- env and rollout ranks on the same devices (collocated) are fused: the policy runs inside the env
  process, with no message per step; otherwise each stage's observations and actions travel
  between env and rollout ranks, and with ``pipeline_stages`` K > 1 one stage simulates while the
  next is being inferred (elastic pipelining);
- components sharing devices take turns under the device lock, offloading when configured
  (context switching); disjoint ones simply overlap;
- the actor consumes the trajectories as soon as the env ranks send them, data-parallel over its
  ranks;
- with ``max_staleness`` s > 0 (a plan setting) the env ranks collect iterations k + 1 .. k + s
  with the weights they hold while the actor trains on iteration k; the weights go to the policy
  copies between collections, and every trajectory carries the version that produced it.

Which iteration collects with which weights is fixed by the loop, not by timing: the collection
of iteration j starts at step max(0, j - s) with the weights of that many trained iterations, so a
run is reproducible and every sample is at most s iterations old. No collection runs past an
iteration that is followed by a checkpoint or an evaluation (the pipeline drains there), so a
checkpoint holds nothing in flight and a run resumed from it equals the uninterrupted run; a stop
request (SIGTERM) starts no new collection, trains the at most s already collected, then saves.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from m2flow.config.convert import to_dict
from m2flow.config.loader import load_config, save_config
from m2flow.envs import EnvConfig
from m2flow.workflows.embodied_config import COMPONENTS, EmbodiedConfig
from m2flow.runtime import Cluster, GroupHandle
from m2flow.planner import Plan
from m2flow.runtime.executors import Executor, GroupSpec
from m2flow.runtime.trace import get_tracer
from m2flow.workers.embodied.messages import InteractStats
from m2flow.workflows.auto_config import is_auto
from m2flow.workflows.embodied_plan import GRAPH, auto_support, plan_embodied, search_space
from m2flow.workflows.stop import EXIT_TERMINATED
from m2flow.workflows.run import (
    CheckpointError,
    RunScaffold,
    checkpoint_path,
    collect_horizon,
    find_checkpoint,
    gather,
    prune_checkpoints,
    read_state,
    run_with_restarts,
    truncate_metrics,
    verify_checkpoint,
    write_state,
)

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"


@dataclass
class TrainResult:
    """What a run did: its directory, plan, per-iteration metrics and every finished episode."""

    run_dir: Path
    mode: str = ""
    fused: bool = False
    history: list[dict[str, float]] = field(default_factory=list)
    episodes: list[tuple[int, float]] = field(default_factory=list)
    """(env steps when the episode was reported, raw return), in order."""
    last_checkpoint: Path | None = None
    startup_s: float = 0.0
    """seconds from the start until the workers were ready (Ray, processes, models)."""
    loop_s: float = 0.0
    """seconds spent in the training loop itself."""
    stopped: bool = False
    """ended early by SIGTERM (after a whole iteration, checkpointed when checkpoints are on)"""
    restarts: int = 0
    """times the flow was restarted after a worker died or hung"""


# ----------------------------------------------------------------------------- the macro loop


def train_loop(flow: EmbodiedFlow, start: int, iterations: int, logger: Any, result: TrainResult,
               eval_every: int = 0, checkpoint_every: int = 0, stop: Callable[[], bool] = lambda: False,
               watch: Callable[[int, dict[str, float]], bool] | None = None) -> None:
    """Iterations ``start .. iterations - 1`` of: sync weights, interact <-> act, train, log, checkpoint.

    ``stop()`` true after an iteration (SIGTERM) ends the loop there, with a checkpoint when configured;
    so does ``watch(iteration, metrics)``, shown every iteration's metrics (re-planning of ``placement: auto``)."""
    def evaluates(it: int) -> bool:
        return bool(eval_every) and ((it + 1) % eval_every == 0 or it + 1 == iterations)

    def checkpoints(it: int) -> bool:
        return bool(checkpoint_every) and ((it + 1) % checkpoint_every == 0 or it + 1 == iterations)

    def drains(it: int) -> bool:  # nothing may be in flight after it
        return it + 1 == iterations or evaluates(it) or checkpoints(it)

    loop_start = time.perf_counter()
    stopping = False
    for it in range(start, iterations):
        t0 = time.perf_counter()
        with get_tracer().span("step", cat="step", step=it):
            horizon = it if stopping else collect_horizon(it, flow.max_staleness, drains)
            sync_s = flow.collect(it, horizon)               # weights -> policy copies; interact <-> act, -> actor
            outcome = flow.finish(it, actor=flow.actor.train(it))  # GAE + PPO as iteration it's trajectories land
        metrics = flow.iteration_metrics(outcome, time.perf_counter() - t0, sync_s)
        if evaluates(it):
            metrics.update(flow.evaluate())
        logger.log(metrics, step=flow.env_steps)
        result.history.append(metrics)
        stopping = stopping or stop() or (watch is not None and watch(it, metrics))
        result.stopped = stopping and not flow.in_flight(it)  # what was collected is trained first
        if checkpoints(it) or (checkpoint_every and result.stopped):
            result.last_checkpoint = flow.save_checkpoint(it + 1)
        if result.stopped:
            break
    result.loop_s = time.perf_counter() - loop_start
    result.episodes = list(flow.episodes)


# ----------------------------------------------------------------------------- the running system


def _gather(handles: dict[str, GroupHandle], timeout: float | None) -> dict[str, list[Any]]:
    """Results of every handle by name; the first failure anywhere raises at once."""
    return dict(zip(handles, gather(list(handles.values()), timeout)))


def _spaces(env: EnvConfig) -> tuple[Any, Any]:
    """The single-env observation and action spaces, from one env built here and closed again."""
    from m2flow.envs import make_env

    probe = make_env(env)
    try:
        return probe.observation_space, probe.action_space
    finally:
        probe.close()


def edge_bytes(cfg: EmbodiedConfig) -> dict[str, float]:
    """Bytes per env step on each data edge, from one env's spaces (float32 everywhere): an observation;
    an action with its value and log-prob; a trajectory step (observation, action, reward, done, value,
    log-prob)."""
    import numpy as np

    obs_space, act_space = _spaces(cfg.env)
    obs = 4.0 * int(np.prod(obs_space.shape or (1,)))
    act = 4.0 * int(np.prod(act_space.shape or (1,)))
    return {"observations": obs, "actions": act + 8.0, "trajectories": obs + act + 16.0}


class EmbodiedFlow:
    """The launched system of one run: env, rollout and actor groups, and the run's counters."""

    def __init__(self, cfg: EmbodiedConfig, plan: Plan, executor: Executor, trace_dir: Path | None = None) -> None:
        from m2flow.workers.embodied.actor import ActorWorker
        from m2flow.workers.embodied.env import EnvWorker
        from m2flow.workers.embodied.rollout import RolloutWorker

        self.cfg = cfg
        self.plan = plan
        self.timeout = cfg.fault_tolerance.iteration_timeout_s
        self.restarts = 0
        self.run_dir = Path(cfg.run_dir)
        self.mode = plan.mode
        self.fused = plan.fused("rollout")
        self.max_staleness: int = plan.settings["max_staleness"]
        # iteration -> the calls of its collection still to be waited for (and the weight sync before it)
        self._pending: dict[int, dict[str, GroupHandle | None]] = {}
        self._next_collect = 0  # the first iteration whose collection has not started
        self._synced: int | None = None  # the version the policy copies hold (staleness > 0)
        rid = uuid.uuid4().hex[:8]
        self.names = {c: f"{c}-{rid}" for c in COMPONENTS}
        ranks = {c: plan[c].world_size for c in COMPONENTS}
        self.env_ranks = ranks["env"]
        policy_holder = plan["rollout"].host
        env_kwargs: dict[str, Any] = dict(actor_group=self.names["actor"], actor_ranks=ranks["actor"],
                                          imports=list(cfg.env_worker.imports),
                                          max_error_rate=cfg.env_worker.max_error_rate)
        if self.fused:
            env_kwargs.update(fused_policy=cfg.policy, policy_seed=cfg.seed, shares_devices=plan["env"].shares_devices,
                              offload=plan["env"].offload)
        else:
            env_kwargs.update(rollout_group=self.names["rollout"], rollout_ranks=ranks["rollout"])
        env_cfg = replace(cfg.env, num_groups=cfg.pipeline_stages, seed=cfg.seed)
        for module in cfg.env_worker.imports:  # custom env ids, for the probe env built here
            importlib.import_module(module)
        obs_space, act_space = _spaces(env_cfg)
        self.iterations = cfg.iterations(self.env_ranks)
        specs: dict[str, GroupSpec] = {
            "env": GroupSpec(EnvWorker, (env_cfg, cfg.rollout_steps), env_kwargs, plan["env"].threads),
            "actor": GroupSpec(ActorWorker, (obs_space, act_space, cfg.policy, cfg.algorithm, cfg.actor),
                               dict(env_group=self.names["env"], env_ranks=self.env_ranks,
                                    total_iterations=self.iterations, seed=cfg.seed,
                                    shares_devices=plan["actor"].shares_devices,
                                    batch_size=cfg.rollout_steps * cfg.env.num_envs * self.env_ranks,
                                    max_staleness=self.max_staleness),
                               plan["actor"].threads),
        }
        if plan["rollout"].launched:
            specs["rollout"] = GroupSpec(
                RolloutWorker, (obs_space, act_space, cfg.policy),
                dict(env_group=self.names["env"], env_ranks=self.env_ranks, stages=cfg.pipeline_stages,
                     rollout_steps=cfg.rollout_steps, seed=cfg.seed, shares_devices=plan["rollout"].shares_devices,
                     offload=plan["rollout"].offload),
                plan["rollout"].threads)
        self.env = self.rollout = self.actor = None
        groups = executor.launch(self.names, plan.placements(), specs, self.run_dir / "logs", trace_dir)
        self.env, self.actor, self.rollout = groups["env"], groups["actor"], groups.get("rollout")
        holder = self.env if self.fused else self.rollout
        self.policy_holder = holder
        self.weight_targets = [(self.names[policy_holder], list(range(ranks[policy_holder])))]
        self.env_steps = 0
        self.episodes: list[tuple[int, float]] = []
        self.recent: deque[float] = deque(maxlen=cfg.return_window)
        self._deltas: list | None = None
        log.info("launched %s%s: %s", self.mode, " (env+rollout fused)" if self.fused else "",
                 ", ".join(f"{c} x{ranks[c]}" for c in COMPONENTS))

    # -- the named steps of the loop ---------------------------------------------------------
    def sync_weights(self) -> float:
        """Stream the actor's weights to every policy copy (rollout ranks, or fused env ranks)."""
        t0 = time.perf_counter()
        _gather({"actor": self.actor.send_weights(self.weight_targets),
                 "holder": self.policy_holder.receive_weights(self.names["actor"], 0)}, self.timeout)
        return time.perf_counter() - t0

    def collect(self, it: int, horizon: int) -> float:
        """Start the collections of iterations up to ``horizon`` not yet started; returns the seconds
        of a synchronous weight sync (0 when it runs on the workers between collections).

        Staleness 0: the weights are synced (and waited for), then iteration ``it`` collects, as
        in synchronous PPO. Otherwise the weights of version ``it`` (iterations trained) are queued
        to the policy copies behind the collections already running, and each new collection is
        queued behind them: the env ranks never wait for the actor's update, only for its weights.
        """
        if self.max_staleness == 0:
            sync_s = self.sync_weights()
            self._pending[it] = {"env": self.env.interact(it, self.pending_norm_deltas(), it), "rollout": self.act(it)}
            self._next_collect = it + 1
            return sync_s
        for j in range(max(self._next_collect, it), horizon + 1):
            handles: dict[str, GroupHandle | None] = {}
            if self._synced != it:
                handles["sync_actor"] = self.actor.send_weights(self.weight_targets, it)
                handles["sync"] = self.policy_holder.receive_weights(self.names["actor"], 0)
                self._synced = it
            handles["env"] = self.env.interact(j, self.pending_norm_deltas(), self._synced)
            handles["rollout"] = self.act(j)
            self._pending[j] = handles
        self._next_collect = max(self._next_collect, horizon + 1)
        return 0.0

    def in_flight(self, it: int) -> bool:
        """Whether a collection past iteration ``it`` has started."""
        return self._next_collect > it + 1

    def act(self, iteration: int) -> GroupHandle | None:
        """The rollout ranks' serving call for one iteration (None: the env ranks run the policy)."""
        return None if self.fused else self.rollout.act(iteration)

    def pending_norm_deltas(self) -> list | None:
        """Every env rank's statistics additions of the last iteration, to merge before this one."""
        deltas, self._deltas = self._deltas, None
        return deltas

    def finish(self, it: int, **handles: GroupHandle | None) -> dict[str, list[Any]]:
        """Wait for iteration ``it``'s collection and the given calls; per name, the results of its ranks."""
        handles = {**self._pending.pop(it), **handles}
        return _gather({k: h for k, h in handles.items() if h is not None}, self.timeout)

    def iteration_metrics(self, outcome: dict[str, list[Any]], seconds: float, sync_s: float) -> dict[str, float]:
        """One dict of metrics for the iteration (env episodes, actor losses, stage times, rates)."""
        stats: list[InteractStats] = outcome["env"]
        if self.cfg.env_worker.sync_normalization and self.env_ranks > 1:
            self._deltas = [s.norm_delta for s in stats]
        steps = sum(s.steps for s in stats)
        self.env_steps += steps
        returns = [r for s in stats for r in s.episode_returns]
        lengths = [n for s in stats for n in s.episode_lengths]
        self.episodes.extend((self.env_steps, r) for r in returns)
        self.recent.extend(returns)
        metrics: dict[str, float] = dict(outcome["actor"][0])
        metrics.update({
            "faults/restarts": float(self.restarts),
            "env/total_steps": float(self.env_steps),
            "env/episodes": float(len(returns)),
            "env/errors_count": float(sum(s.errors for s in stats)),
            "time/iteration_s": seconds,
            "time/weight_sync_s": max(outcome["sync"]) if "sync" in outcome else sync_s,
            "time/env_steps_per_s": steps / seconds,
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

    def evaluate(self) -> dict[str, float]:
        """Deterministic episodes of the current policy with env rank 0's statistics, in this process."""
        from m2flow.workers.embodied.evaluate import evaluate_policy

        weights = self.actor.state_dict(ranks=[0]).wait()[0]
        norm = self.env.normalizer_state(ranks=[0]).wait()[0]
        return evaluate_policy(self.cfg.env, self.cfg.policy, weights, norm, self.cfg.eval_episodes,
                               seed=self.cfg.seed)

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, next_iteration: int) -> Path:
        """Actor (weights, optimizer, shuffling), env ranks (envs, statistics), noise generators, counters."""
        if self._next_collect > next_iteration:
            raise RuntimeError(f"checkpoint at iteration {next_iteration}: the collection of iteration "
                               f"{self._next_collect - 1} has started (the loop drains before a checkpoint)")
        path = checkpoint_path(self.run_dir, next_iteration)
        handles = {"actor": self.actor.save_checkpoint(str(path)), "env": self.env.save_checkpoint(str(path))}
        if not self.fused:
            handles["rollout"] = self.rollout.save_checkpoint(str(path))
        saved = _gather(handles, self.timeout)
        save_config(self.cfg, path / CONFIG_FILE, workflow="embodied")  # what evaluation needs
        write_state(path, {"workflow": "embodied", "next_step": next_iteration, "env_steps": self.env_steps,
                           "actor": saved["actor"][0],  # counters such as the skipped updates in a row
                           "episodes": self.episodes, "recent": list(self.recent), "norm_deltas": self._deltas,
                           "seed": self.cfg.seed, "env_ranks": self.env_ranks, "fused": self.fused})
        log.info("checkpoint %s", path)
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        return path

    def load_checkpoint(self, path: Path) -> int:
        """Restore every worker and the counters; returns the iteration to continue from."""
        state = read_state(path)
        if state["env_ranks"] != self.env_ranks:
            raise ValueError(f"resume: {path} was written by {state['env_ranks']} env ranks, "
                             f"this placement has {self.env_ranks}")
        handles = {"actor": self.actor.load_checkpoint(str(path), state.get("actor")),
                   "env": self.env.load_checkpoint(str(path))}
        if not self.fused:
            if state["fused"]:
                raise ValueError(f"resume: {path} holds no rollout ranks' generators (written by a fused plan)")
            handles["rollout"] = self.rollout.load_checkpoint(str(path))
        _gather(handles, self.timeout)
        self.env_steps = state["env_steps"]
        self.episodes = [(int(n), float(r)) for n, r in state["episodes"]]
        self.recent.extend(state["recent"])
        self._deltas = state["norm_deltas"]
        self._next_collect = int(state["next_step"])
        return self._next_collect

    def shutdown(self) -> None:
        for group in (self.actor, self.rollout, self.env):
            if group is not None:
                group.shutdown()


# ----------------------------------------------------------------------------- entry points


def train(cfg: EmbodiedConfig, cluster: Cluster | None = None,
          watch: Callable[[int, dict[str, float]], bool] | None = None) -> TrainResult:
    """Run (or resume) the workflow; ``cluster`` reuses a running one (else Ray starts here). A worker
    that dies or hangs restarts the flow from the newest checkpoint (``fault_tolerance``). With
    ``placement: auto`` the planner chooses the plan first (``auto.py``)."""
    if is_auto(cfg.placement):
        from m2flow.workflows.auto import train_auto

        return train_auto("embodied", cfg, cluster)

    def attempt(resume: str | None, restarts: int) -> TrainResult:
        return _train_once(replace(cfg, resume=resume), cluster, restarts, watch)

    return run_with_restarts(attempt, cfg.resume, cfg.run_dir, cfg.fault_tolerance)


def _train_once(cfg: EmbodiedConfig, cluster: Cluster | None, restarts: int,
                watch: Callable[[int, dict[str, float]], bool] | None = None) -> TrainResult:
    from m2flow.metrics import MetricsLogger

    started = time.perf_counter()
    result = TrainResult(Path(cfg.run_dir), restarts=restarts)
    with RunScaffold(cfg.run_dir, placement=cfg.placement, cluster_config=cfg.cluster, cluster=cluster,
                     trace=cfg.trace) as run:
        resume = find_checkpoint(cfg.resume, cfg.run_dir)
        executor = run.executor()
        plan = run.adopt(plan_embodied(cfg, executor.layout))
        flow = EmbodiedFlow(cfg, plan, executor, run.trace_dir)
        flow.restarts = restarts
        try:
            result.mode, result.fused = flow.mode, flow.fused
            start = 0
            if resume is not None:
                start = flow.load_checkpoint(resume)
                truncate_metrics(cfg.run_dir, flow.env_steps)  # rows are logged at step = env steps so far
                log.info("resuming from %s at iteration %d", resume, start)
            result.startup_s = time.perf_counter() - started
            description = f"embodied {cfg.env.env_id} ({flow.mode}{', fused' if flow.fused else ''})"
            with MetricsLogger(result.run_dir, cfg.metrics,
                               total_steps=flow.iterations * cfg.batch_size(flow.env_ranks),
                               description=description, run_config=to_dict(cfg)) as logger:
                train_loop(flow, start, flow.iterations, logger, result, cfg.eval_every, cfg.checkpoint_every,
                           run.stop, watch)
        finally:
            flow.shutdown()
    (result.run_dir / "episodes.json").write_text(json.dumps(result.episodes))
    return result


def evaluate_checkpoint(path: str | Path, episodes: int = 10, overrides: Sequence[str] = (),
                        deterministic: bool = True) -> dict[str, float]:
    """Deterministic episodes of a saved checkpoint's policy, in this process (no workers).

    The run's config is read from the checkpoint; ``overrides`` (``key=value``) change it, e.g.
    ``env.num_envs=1`` or ``env.env_kwargs.render_mode=human``.
    """
    from m2flow.workers.embodied.evaluate import evaluate_policy, load_checkpoint_parts

    path = Path(path)
    if verify_checkpoint(path).get("workflow") != "embodied":
        raise CheckpointError(f"{path} is not an embodied checkpoint")
    cfg = load_config(EmbodiedConfig, path / CONFIG_FILE, overrides)
    weights, norm = load_checkpoint_parts(path)
    return evaluate_policy(cfg.env, cfg.policy, weights, norm, episodes, seed=cfg.seed,
                           deterministic=deterministic)


def run_embodied(cfg: EmbodiedConfig) -> int:
    """Entry point of ``m2flow train`` for ``workflow: embodied``."""
    result = train(cfg)
    last = result.history[-1] if result.history else {}
    summary = ", ".join(f"{k}={last[k]:.4g}" for k in ("env/episode_return_recent", "time/env_steps_per_s",
                                                       "eval/return") if k in last)
    restarts = f"; {result.restarts} restart(s) after a worker died or hung" if result.restarts else ""
    logging.getLogger("m2flow").info("%s (%s): %s%s; run directory %s", "stopped" if result.stopped else "done",
                                     result.mode, summary or "no iterations run", restarts, result.run_dir)
    return EXIT_TERMINATED if result.stopped else 0


def _register() -> None:
    from m2flow.workflows.registry import register_workflow

    register_workflow("embodied", EmbodiedConfig, run_embodied, plan=plan_embodied, graph=GRAPH,
                      search=search_space, auto=auto_support(train, edge_bytes))


_register()
