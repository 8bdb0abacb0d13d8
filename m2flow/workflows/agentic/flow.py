"""The agentic workflow's live system: env workers, rollout and actor groups, and the turn loop between them.

One iteration is ``groups_per_step`` GRPO groups of ``group_size`` episodes (a group's episodes are
reset with the same seed). ``_play`` plays an iteration's episodes on a thread of the flow, one iteration
after another, through the one turn loop (``workers/agentic/turn_loop.play_turns``) between the rollout
ranks and the env workers (``sides.py``): env workers reset their environments, then rounds of one model
turn for every running episode (rollout) and one step of each environment that got an action (env
workers), until every episode has ended or spent its turn or token budget. With the environments fused
into a single rollout rank, that rank runs the same loop itself (``play_iteration``): one message per
iteration instead of three per round. The rollout puts each group into the trajectories stream the moment
its last episode ends, and the actor, called before the loop runs, trains on what is ready, so a few long
episodes do not idle it. Actions and observations travel as the arguments and results of the
env workers' calls.

Bounded staleness (``algorithm.max_staleness`` s): the episodes of iteration j are played behind the
weights of iteration max(0, j - s), as in the reasoning workflow; every call on a group runs in the
order issued (the weight send on the actor from the driver, everything on the rollout from the loop
thread), so which weights play which iteration is fixed by the loop, not by timing.

Partial rollouts (``rollout.partial``, ``workers/agentic/partial_episodes.py``): an iteration's turn loop stops
once every rollout rank has handed out the groups it owes (``_play_partial``, or the rank itself with the
environments fused in), and the running episodes stay on their ranks and env workers for the next iteration,
which plays them on under its weights together with a new batch of groups. Their tokens are then trained an iteration after they were sampled, so the rollout plays
max_staleness - 1 iterations ahead, not max_staleness. The first iteration of a fresh run takes one batch of
groups more than it trains; each later one takes the next batch. A checkpoint holds the carried task instances
(``PARTIAL_KEY`` in the driver's state), and a resumed run plays them again from their resets.

Fault isolation: every env worker is a group of one rank of its own. One that dies or gives no answer
within ``env.worker_timeout_s`` is shut down and launched again alone through the executor (the other
groups keep their processes), and only its episodes that had not ended are played again from their
reset, under their own trajectory ids: nothing is lost, nothing is sent twice. The runtime restarts
whole flows only; the graph marks the env ``rank_groups``, so ``launch_plan`` starts a group per env rank
and relaunches one alone (``RankGroups.restart``) when this flow, which decides when, asks.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from m2flow.runtime.waiting import gather
from m2flow.driver.workflow import Flow, Launch
from m2flow.planner import Plan
from m2flow.planner.partial import run_ahead
from m2flow.runtime.errors import worker_died
from m2flow.runtime.executors import Executor, Handle
from m2flow.workers.agentic.turn_loop import Rounds, play_turns
from m2flow.workers.agentic.turns import EpisodeSpec
from m2flow.workers.stats import WEIGHT_KEY
from m2flow.workflows.agentic.settings import AgenticRun, WorkerSettings
from m2flow.workflows.agentic.sides import EnvWorkers, RolloutRanks

log = logging.getLogger(__name__)

PARTIAL_KEY = "partial_episodes"
"""The driver-state key of the task instances partial rollouts carry at a checkpoint (``PartialEpisodes.state``)."""

EVAL_SEED = 1_000_000_007
"""First seed of the held-out episodes (the same every evaluation, so curves compare like with like)."""


@dataclass(frozen=True)
class Prepared:
    """What the driver prepares once before any worker starts: the model to load."""

    model_path: Path


def episode_specs(groups_per_step: int, group_size: int, seed_offset: int, step: int,
                  env_ranks: int) -> list[EpisodeSpec]:
    """The episodes of iteration ``step``: group ``slot``'s ``group_size`` episodes share a seed; ids run on
    across iterations; episode i of the iteration plays on env worker i mod ``env_ranks``."""
    per_step = groups_per_step * group_size
    return [EpisodeSpec(step * per_step + i, i // group_size, seed_offset + step * groups_per_step + i // group_size,
                        i % env_ranks)
            for i in range(per_step)]


def partial_specs(groups_per_step: int, group_size: int, seed_offset: int, batch: int,
                  env_ranks: int) -> list[EpisodeSpec]:
    """The episodes of batch ``batch`` of partial rollouts: those of ``episode_specs`` for iteration ``batch``,
    each group's slot its running number in the run (a task instance is held until an iteration hands it out,
    at the slot of that iteration's quota it takes then)."""
    return [replace(s, slot=batch * groups_per_step + s.slot)
            for s in episode_specs(groups_per_step, group_size, seed_offset, batch, env_ranks)]


def merge_rollout_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The rollout ranks' metrics as one: counts summed, means weighted by each rank's trajectories."""
    weights = [p.get("rollout/trajectories", 0.0) for p in parts]
    out: dict[str, float] = {}
    for key in sorted({k for p in parts for k in p}):
        present = [(w, p[key]) for w, p in zip(weights, parts) if key in p]
        if key.endswith(("_mean", "/mean", "/success")):
            total = sum(w for w, _ in present)
            out[key] = sum(w * v for w, v in present) / total if total else 0.0
        else:
            out[key] = float(sum(v for _, v in present))
    return out


class AgenticFlow(Flow):
    """The launched system of one run attempt (the driver's ``Flow``)."""

    def __init__(self, workflow: Any, plan: Plan, executor: Executor, run: Launch, *, settings: AgenticRun,
                 workers: WorkerSettings) -> None:
        """``settings``: what the flow reads of the config; ``workers``: the workers' settings from the
        plan's stream (``worker_settings`` with the config and the plan bound)."""
        state = run.state or {}
        self.settings, self.plan, self.description = settings, plan, plan.mode
        self.timeout = settings.iteration_timeout_s
        self.iterations = self.progress_total = settings.steps
        # the batch shape is the plan's: groups (seeds) per iteration, episodes per group
        self.groups_per_step, self.group_size = plan.settings["groups_per_step"], plan.settings["group_size"]
        # Iterations played ahead: the plan's run_ahead (max_staleness, one less with partial rollouts: a carried
        # episode's tokens are trained an iteration later), which the simulator plays too; a plan file saved before
        # the setting existed says max_staleness only.
        self.max_staleness = int(plan.settings.get("run_ahead", run_ahead(int(plan.settings.get("max_staleness", 0)),
                                                                          settings.partial)))
        self.env_fused = plan.fused("env")
        self.rollout_ranks, self.actor_ranks = plan["rollout"].world_size, plan["actor"].world_size
        self.partial = settings.partial
        carried = state.get(PARTIAL_KEY)
        self._provision = self.partial and carried is None  # the next iteration takes an extra batch to carry
        self._batch = run.start + (1 if self.partial and carried is not None else 0)  # the next batch of groups
        self.env_ranks = self.rollout_ranks if self.env_fused else plan["env"].world_size
        # Fused, the rollout hosts the environments; else every env worker is a group of one rank of its own
        # (the graph's ``rank_groups``), so it can be restarted alone.
        self.launched = workflow.launch_plan(plan, executor, run, lambda wiring: workers(
            str(run.prepared.model_path), wiring.streams["trajectories"], self.env_ranks,
            resume_dir=str(run.checkpoint) if run.checkpoint else None, counters=state.get("actor"),
            start_step=run.start))
        self.names, self.stream = self.launched.names, self.launched.streams["trajectories"]
        self.rollout, self.actor = self.launched["rollout"], self.launched["actor"]
        self.envs = self.launched["env"]  # env workers, or the rollout ranks' environments (called by rank alike)
        self._loop = ThreadPoolExecutor(1, thread_name_prefix="agentic-turns")
        self._played: dict[int, Future] = {}
        self._training: dict[int, Handle] = {}
        self._next = self.done = run.start  # the first iteration whose episodes are not queued yet; trained
        self._synced: int | None = None
        self._awaiting: list[int] = []  # partial rollouts with env.async_steps: the episodes whose steps are out
        if carried is not None:
            self._restore_partial(carried)

    def _restore_partial(self, carried: list[list[int]]) -> None:
        """Give the rollout the task instances carried at the checkpoint (they start over from their resets)."""
        groups = len({row[1] for row in carried})
        if not self.partial:
            if groups:
                log.warning("the checkpoint holds %d task instance(s) carried by partial rollouts, which are off in "
                            "this run: they are not trained", groups)
            return
        log.info("%d task instance(s) carried at the checkpoint are played again from their resets", groups)
        router = RolloutRanks(self.rollout, self.rollout_ranks, [], self.timeout, groups_per_step=self.groups_per_step)
        shares = [[row for row in carried if router.rank_of(EpisodeSpec(*row)) == r] for r in range(self.rollout_ranks)]
        gather([self.rollout.execute_each("restore_partial", [(share,) for share in shares])], self.timeout,
               "restoring the carried episodes")

    # -- env workers -----------------------------------------------------------------------------
    def _restart_env(self, e: int, error: BaseException) -> None:
        """Shut env worker ``e`` down and launch it again, alone; too many restarts re-raise ``error``."""
        if self.env_fused or self.env_restarts >= self.settings.max_env_restarts:
            raise error
        log.warning("env worker %d lost (%s); restarting it alone (%d so far)", e, str(error).splitlines()[0],
                    self.env_restarts + 1)
        self.envs.restart(e)

    @property
    def env_restarts(self) -> int:
        """Env workers launched again so far (none when the rollout hosts the environments)."""
        return 0 if self.env_fused else self.envs.restarts

    def _env_round(self, calls: dict[int, tuple[str, tuple]]) -> tuple[dict[int, Any], list[int]]:
        """Call each env worker (``e -> (method, args)``) and wait for all: the results of those that answered,
        and the env workers that died or hung (restarted already)."""
        handles = {e: self.envs.execute(method, *args, ranks=[e]) for e, (method, args) in calls.items()}
        limit = self.settings.env_timeout_s
        results, lost = {}, []
        for e, h in handles.items():
            try:
                results[e] = gather([h], limit, f"env worker {e}: {h.method}")[0][0]
            except Exception as error:  # noqa: BLE001 - only a lost worker is survived
                if not worker_died(error):
                    raise
                self._restart_env(e, error)
                lost.append(e)
        return results, lost

    def env_pids(self) -> list[int]:
        """The process id of every env worker (tests check that a restart touches one only)."""
        return self.envs.pids()

    # -- one iteration's episodes ---------------------------------------------------------------
    def _specs(self, step: int) -> list[EpisodeSpec]:
        """The new episodes of iteration ``step``: its own, or with partial rollouts the next batch (two, the
        first iteration of a fresh run)."""
        if not self.partial:
            return episode_specs(self.groups_per_step, self.group_size, self.settings.seed_offset, step,
                                 self.env_ranks)
        batches = [self._batch, self._batch + 1] if self._provision else [self._batch]
        self._batch, self._provision = batches[-1] + 1, False
        return [s for b in batches for s in partial_specs(self.groups_per_step, self.group_size,
                                                          self.settings.seed_offset, b, self.env_ranks)]

    def _play(self, step: int, version: int | None, specs: list[EpisodeSpec]) -> dict[str, float]:
        """Every episode of iteration ``step`` until it ends (on the loop thread); the rollout and env metrics."""
        t_start = time.perf_counter()
        where = f"in iteration {step}"
        # The weights this iteration plays with, when it is the first behind a new version (the actor sends
        # them; see ``start``).
        weights = (self.names["actor"], 0, version) if version is not None else None
        if self.env_fused and self.rollout_ranks == 1:  # every environment in the one rollout process
            quota = self.groups_per_step if self.partial else None
            metrics = gather([self.rollout.play_iteration(step, specs, where, weights, quota)],
                             self.timeout, "rollout: play_iteration")[0][0]
            metrics["time/rollout_s"] = time.perf_counter() - t_start
            return metrics
        if weights is not None:
            gather([self.rollout.receive_weights(*weights)], self.timeout, "a weight sync")
        if self.partial:
            rounds, metrics = self._play_partial(step, specs)
        else:
            policy = RolloutRanks(self.rollout, self.rollout_ranks, specs, self.timeout)
            per_rollout: list[list[EpisodeSpec]] = [[] for _ in range(self.rollout_ranks)]
            for s in specs:
                per_rollout[policy.rank_of(s)].append(s)
            gather([self.rollout.execute_each("begin", [(step, mine) for mine in per_rollout])], self.timeout)
            envs = EnvWorkers(self._env_round, specs, overlap=self.settings.async_steps)
            rounds = play_turns(policy, envs, [s.traj_id for s in specs])
            metrics = merge_rollout_metrics(gather([self.rollout.end()], self.timeout, "rollout: end")[0])
        env_stats, _ = self._env_round({e: ("env_stats", (where,)) for e in range(self.env_ranks)})
        for out in env_stats.values():
            for k, v in out.items():
                metrics[k] = metrics.get(k, 0.0) + v
        metrics.update(rounds.metrics())
        # The env workers' CPU per rank: the part of their busy time that computes (the rest waits on tools).
        metrics["time/env_cpu_s"] = metrics.get("time/env_cpu_s", 0.0) / self.env_ranks
        metrics["time/rollout_s"] = time.perf_counter() - t_start
        return metrics

    def _play_partial(self, step: int, specs: list[EpisodeSpec]) -> tuple[Rounds, dict[str, float]]:
        """Partial rollouts over rollout ranks and env workers: each rank owes the slots of the iteration's
        quota it plays (``RolloutRanks.rank_of``); the loop stops once every rank has filled them, and the
        episodes still running stay on their ranks and env workers for the next iteration."""
        ranks, per_step = self.rollout_ranks, self.groups_per_step
        router = RolloutRanks(self.rollout, ranks, specs, self.timeout, groups_per_step=per_step)
        per_rollout: list[list[EpisodeSpec]] = [[] for _ in range(ranks)]
        for s in specs:
            per_rollout[router.rank_of(s)].append(s)
        quotas = [[g for g in range(per_step) if g % ranks == r] for r in range(ranks)]
        opened = gather([self.rollout.execute_each("begin_partial", [(step, mine, quota) for mine, quota in
                                                                     zip(per_rollout, quotas)])], self.timeout)[0]
        held = [EpisodeSpec(*row) for o in opened for row in [*o[0], *o[1]]]
        policy = RolloutRanks(self.rollout, ranks, held, self.timeout, groups_per_step=per_step)

        def met() -> bool:
            return all(gather([self.rollout.quota_met()], self.timeout, "rollout: quota_met")[0])

        envs = EnvWorkers(self._env_round, held, keep_running=True, overlap=self.settings.async_steps,
                          awaiting=self._awaiting)
        rounds = play_turns(policy, envs, [row[0] for o in opened for row in o[0]],
                            running=[row[0] for o in opened for row in o[1]], until=met)
        self._awaiting = sorted(envs.awaiting)  # steps still out go on in the next iteration's loop
        return rounds, merge_rollout_metrics(gather([self.rollout.end_partial()], self.timeout, "rollout: end")[0])

    # -- the driver's Flow -------------------------------------------------------------------------
    def start(self, it: int, horizon: int) -> None:
        """Queue the episodes of every iteration up to ``horizon`` not started yet, the first behind the weights
        of version ``it``; the actor's training of ``it`` is called at once, so it takes groups as they end."""
        if self._next <= horizon:
            version = None
            if self._synced != it:
                # Issued here, on the driver: on the actor the send comes after training it - 1, before
                # training it. The rollout's receive is the first call the loop thread makes.
                self._sending = self.actor.send_weights([(self.names["rollout"], list(range(self.rollout_ranks)))])
                version, self._synced = it, it
            for j in range(max(self._next, it), horizon + 1):
                self._played[j] = self._loop.submit(self._play, j, version, self._specs(j))
                version = None
            self._next = horizon + 1
        if it not in self._training:
            self._training[it] = self.actor.train(it, self.groups_per_step)

    def finish(self, it: int) -> dict[str, float]:
        """Wait for iteration ``it``'s episodes and the actor's update on them; one dict of metrics."""
        played = self._played.pop(it)
        training = self._training.pop(it)
        try:
            metrics = dict(played.result())
        except BaseException:
            self._abandon()
            raise
        actor = gather([training, self._sending] if self._sending is not None else [training],
                       self.timeout, f"iteration {it}")[0]
        self._sending = None
        metrics.update({k: v for k, v in actor[0].items() if k != WEIGHT_KEY})
        metrics["faults/env_restarts"] = float(self.env_restarts)
        self.done = it + 1
        return metrics

    _sending: Handle | None = None

    def _abandon(self) -> None:
        """A failed turn loop: close the stream, so an actor waiting for its groups stops waiting."""
        self.stream.abort()  # at once: the rank that failed may be frozen, and never confirm its puts

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        return {"time/step": seconds,
                "perf/trajectories_per_s": metrics.get("rollout/responses_count", 0.0) / seconds,
                "perf/tokens_per_s": metrics.get("rollout/tokens_count", 0.0) / seconds}

    def in_flight(self, it: int) -> bool:
        return self._next > it + 1

    def evaluate(self) -> dict[str, float]:
        """Greedy held-out episodes of the current policy on rollout rank 0 (``eval/...``)."""
        if self._synced != self.done:
            send = self.actor.send_weights([(self.names["rollout"], list(range(self.rollout_ranks)))])
            gather([send, self.rollout.receive_weights(self.names["actor"], 0, self.done)], self.timeout,
                   "the weight sync before an evaluation")
            self._synced = self.done
        start = time.perf_counter()
        run = self.settings
        seeds = list(range(EVAL_SEED, EVAL_SEED + run.eval_episodes))
        out = gather([self.rollout.evaluate(run.eval_env, seeds, run.eval_temperature, ranks=[0])], self.timeout,
                     "the held-out evaluation")[0][0]
        out["time/eval"] = time.perf_counter() - start
        return out

    def save(self, path: Path) -> dict[str, Any]:
        """The actor's weights, optimizer and RNG; with partial rollouts the carried task instances (not their
        episodes: an environment's state is not saved; a resumed run plays them again from their resets);
        nothing may be in flight (the loop drains first)."""
        if self._next > self.done:
            raise RuntimeError(f"checkpoint after iteration {self.done}: iteration {self._next - 1} has started")
        counters = gather([self.actor.save_checkpoint(str(path))], self.timeout, "a checkpoint")[0][0]
        if not self.partial:
            return {"actor": counters}
        carried = [row for rank in gather([self.rollout.partial_state()], self.timeout, "a checkpoint")[0] for row in rank]
        log.info("checkpoint after iteration %d: %d carried task instance(s) saved; a run resumed from it plays "
                 "them again from their resets", self.done, len({row[1] for row in carried}))
        return {"actor": counters, PARTIAL_KEY: carried}

    def summary(self, history: list[dict[str, float]]) -> str:
        parts = [f"agentic ({self.plan.mode}): {len(history)} iteration(s)"]
        for key in ("reward/mean", "eval/return_mean"):
            seen = [h[key] for h in history if key in h]
            if seen:
                parts.append(f"{key} {seen[0]:.3f} -> {seen[-1]:.3f}")
        if self.env_restarts:
            parts.append(f"{self.env_restarts} env worker restart(s)")
        return "; ".join(parts)

    def shutdown(self) -> None:
        """Close the stream (ending any wait on it), stop the loop, then every group and the stream."""
        self.launched.abort()  # at once, not after every connected rank confirmed its puts: a frozen rank never would
        self._loop.shutdown(wait=True, cancel_futures=True)
        self.launched.shutdown()
