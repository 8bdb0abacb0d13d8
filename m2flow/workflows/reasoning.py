"""The reasoning RL workflow (``workflow: reasoning``): the macro loop, and what launches it.

``train_loop`` is the whole algorithm as a short sequence of named steps. It is the same for every
placement: collocated components take turns on their shared devices (the device lock), while
disaggregated or hybrid ones overlap, each consuming the groups the previous stage emits as soon
as they are ready. Which of those happens is decided by the placement alone.

Bounded staleness (``algorithm.max_staleness`` s, a plan setting): the generation of iteration j
is queued at step max(0, j - s), behind the weights of that many trained iterations, so the rollout
(and reward, inference) work on iterations k + 1 .. k + s while the actor trains on k. Each worker
runs its calls in order, so the weights reach the rollout between two of its iterations, and which
weights generate which iteration is fixed by the loop, not by timing: a run is reproducible and
every group is at most s versions old (the actor drops and counts any older one). No generation
starts past an iteration followed by a checkpoint or a held-out evaluation: the pipeline drains
there, so a checkpoint holds nothing in flight (nothing to save or regenerate) and a run resumed
from it equals the uninterrupted run. Staleness 0 is the synchronous flow.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from m2flow.config.convert import to_dict
from m2flow.data import PromptDataLoader, PromptDataset, PromptItem
from m2flow.workflows.evaluation import score_responses
from m2flow.workflows.reasoning_config import COMPONENTS, ReasoningConfig
from m2flow.runtime import Cluster, GroupHandle, WorkerGroup
from m2flow.planner import Plan
from m2flow.workflows.auto_config import is_auto
from m2flow.workflows.reasoning_plan import GRAPH, auto_support, plan_reasoning, search_space
from m2flow.workflows.stop import EXIT_TERMINATED
from m2flow.workflows.run import (
    CHECKPOINTS,
    RunScaffold,
    checkpoint_path,
    collect_horizon,
    find_checkpoint,
    gather,
    prune_checkpoints,
    read_state,
    run_with_restarts,
    truncate_metrics,
    write_state,
)
from m2flow.runtime.executors import Executor, GroupSpec
from m2flow.runtime.trace import get_tracer
from m2flow.workers.messages import PromptTask
from m2flow.workers.stats import WEIGHT_KEY, merge_rank_metrics
from m2flow.workers.streams import GroupStream

log = logging.getLogger(__name__)



@dataclass
class TrainResult:
    """What a run did: its directory, the metrics of every iteration, its last checkpoint."""

    run_dir: Path
    mode: str
    history: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    stopped: bool = False
    """ended early by SIGTERM (after a whole iteration, checkpointed when checkpoints are on)"""
    restarts: int = 0
    """times the flow was restarted after a worker died or hung"""


# ----------------------------------------------------------------------------- the macro loop


def train_loop(flow: ReasoningFlow, loader: PromptDataLoader, start: int, steps: int, logger: Any,
               eval_every: int = 0, checkpoint_every: int = 0,
               stop: Callable[[], bool] = lambda: False,
               watch: Callable[[int, dict[str, float]], bool] | None = None) -> list[dict[str, float]]:
    """Iterations ``start .. steps - 1`` of: sync, generate, score, log-probs, train, log, checkpoint.

    With ``max_staleness`` s > 0 (a plan setting) step k queues the generation of every iteration up
    to k + s not yet started (``collect_horizon``), behind the weights of version k: the rollout
    generates ahead while the actor trains on k. ``stop()`` true after an iteration (SIGTERM) starts
    no new generation; once what was generated is trained the loop ends, with a checkpoint when
    configured. ``watch(step, metrics)``, shown every iteration's metrics (re-planning of ``placement:
    auto``), stops the loop the same way when it returns true."""
    def evaluates(step: int) -> bool:  # held-out evaluation before iteration ``step``
        return bool(eval_every) and step % eval_every == 0

    def checkpoints(step: int) -> bool:
        return bool(checkpoint_every) and ((step + 1) % checkpoint_every == 0 or step + 1 == steps)

    def drains(step: int) -> bool:  # nothing may be in flight after it
        return step + 1 >= steps or checkpoints(step) or evaluates(step + 1)

    history = []
    stopping = False
    for step in range(start, steps):
        t0 = time.perf_counter()
        with get_tracer().span("step", cat="step", step=step):
            horizon = step if stopping else collect_horizon(step, flow.max_staleness, drains)
            syncing = flow.sync_weights(step) if flow.starts_by(horizon) else []  # actor -> rollout, inference
            evaluated = flow.evaluate(syncing) if evaluates(step) else {}
            slots = flow.start(step, horizon, loader, syncing)       # prompts; rollout emits each group when
                                                                     # done, reward scores what is ready,
                                                                     # inference adds log-probs, if any
            metrics = flow.finish(step, actor=flow.actor.train(step, slots))  # trains on micro-batches as they come
        # Held-out evaluation is timed on its own, so time/step and the rates describe training only.
        seconds = time.perf_counter() - t0 - evaluated.get("time/eval", 0.0)
        metrics.update(evaluated, **flow.rates(metrics, seconds))
        logger.log(metrics, step=step + 1)
        history.append(metrics)
        wants_stop = watch is not None and watch(step, metrics)
        stopping = stopping or stop() or wants_stop
        stopped = stopping and not flow.in_flight(step)  # what was generated is trained first
        if checkpoint_every and (checkpoints(step) or stopped):
            flow.save_checkpoint(step + 1, loader)
        if stopped:
            return history
    if eval_every:
        final = flow.evaluate(flow.sync_weights(steps))
        logger.log(final, step=steps)
        if history:  # the last entry describes the policy after the last update
            history[-1].update(final)
    return history


@dataclass
class _Started:
    """An iteration whose generation is queued: its prompt count, its calls and the weight sync before them."""

    slots: int
    calls: dict[str, GroupHandle]
    syncing: list[GroupHandle]


# ----------------------------------------------------------------------------- the running system


class ReasoningFlow:
    """The launched system of one run: worker groups, the streams between them, and the data."""

    def __init__(self, cfg: ReasoningConfig, plan: Plan, executor: Executor, model_path: Path, train: PromptDataset,
                 test: PromptDataset | None, resume_dir: Path | None = None, trace_dir: Path | None = None,
                 actor_counters: dict[str, int] | None = None, start_step: int = 0) -> None:
        from m2flow.workers.actor import ActorWorker
        from m2flow.workers.inference import InferenceWorker
        from m2flow.workers.reward import RewardWorker
        from m2flow.workers.rollout import RolloutWorker

        self.cfg = cfg
        self.plan = plan
        self.timeout = cfg.fault_tolerance.iteration_timeout_s
        self.restarts = 0
        self.train_set = train
        self.test_set = test
        self.run_dir = Path(cfg.run_dir)
        self.mode = plan.mode
        rid = uuid.uuid4().hex[:8]
        self.max_staleness = int(plan.settings.get("max_staleness", 0))
        """How many iterations the rollout may generate ahead of the actor (0: synchronous)."""
        self._started: dict[int, _Started] = {}
        self._next = start_step  # the first iteration whose generation is not queued yet
        # Up to s + 1 iterations are in flight at once: the streams downstream of generation, which
        # several ranks feed, keep each iteration in a lane of its own (the prompts have one producer).
        # One stream per data edge the plan uses; a fused reward scores inside the rollout, so the
        # rollout emits scored groups and "responses" needs none. (A stream whose producer and
        # consumer share a process keeps its items there: ``GroupStream.keep_local``.)
        streams = {e.name: GroupStream.create(f"{e.name}-{rid}", e.consumers,
                                              1 if e.name == "prompts" else self.max_staleness + 1)
                   for e in plan.edges
                   if GRAPH.edge(e.name).kind == "stream" and e.transport != "unused"
                   and not (e.name == "responses" and e.transport == "in-process")}
        self.prompts = streams["prompts"]
        scored = streams["scored"]
        ready = streams.get("ready", scored)  # without inference, scored groups go straight to the actor
        responses = streams.get("responses", scored)  # reward fused: the rollout scores and emits scored groups
        self.streams = list(streams.values())
        self.infers = plan.runs("inference")
        self.reward_fused = plan.fused("reward")
        self.rollout_fused = plan.fused("rollout")
        n = cfg.rollout.sampling.n
        temperature = cfg.rollout.sampling.temperature
        path = str(model_path)
        algo = cfg.algorithm
        scoring = {"max_new_tokens": cfg.rollout.sampling.max_new_tokens, "dynamic_sampling": algo.dynamic_sampling}
        fused_scorer = {"cfg": cfg.reward, **scoring} if self.reward_fused else None
        turns = {c.name: c.shares_devices for c in plan.components}
        emit = {"emit_each_group": plan.settings.get("emit", "each group") == "each group"}  # continuous batching
        specs: dict[str, GroupSpec] = {
            "rollout": GroupSpec(RolloutWorker, (path, cfg.rollout, self.prompts, responses),
                                 {"seed": cfg.seed, "shares_devices": turns["rollout"], "scorer": fused_scorer,
                                  **emit}),
            "reward": GroupSpec(RewardWorker, (cfg.reward, responses, scored), scoring),
            "inference": GroupSpec(InferenceWorker, (path, cfg.inference, cfg.algorithm, temperature, n, scored, ready),
                                   {"shares_devices": turns["inference"]}),
            "actor": GroupSpec(ActorWorker, (path, cfg.actor, cfg.algorithm, temperature, n, ready),
                               {"total_steps": cfg.steps, "seed": cfg.seed, "shares_devices": turns["actor"],
                                "resume_dir": str(resume_dir) if resume_dir else None,
                                "counters": actor_counters, "start_step": start_step}),
        }
        if self.rollout_fused:
            specs["actor"].kwargs["generation"] = {"cfg": cfg.rollout, "prompts": self.prompts, "responses": responses,
                                                   "seed": cfg.seed, "scorer": fused_scorer, **emit}
        specs = {c: replace(specs[c], threads=plan[c].threads) for c in plan.launched}
        self.names = {c: f"{c}-{rid}" for c in COMPONENTS}
        groups = executor.launch(self.names, plan.placements(), specs, self.run_dir / "logs", trace_dir)
        self.actor = groups["actor"]
        self.rollout = self.actor if self.rollout_fused else groups["rollout"]
        self.reward: WorkerGroup | None = groups.get("reward")
        self.inference: WorkerGroup | None = groups.get("inference")
        ranks = {c: plan[c].world_size for c in COMPONENTS}
        self.weight_targets = [] if self.rollout_fused else [(self.names["rollout"], list(range(ranks["rollout"])))]
        self.syncs_inference = self.inference is not None and self.inference.wants_weights(ranks=[0]).wait()[0]
        if self.syncs_inference:
            self.weight_targets.append((self.names["inference"], list(range(ranks["inference"]))))
        notes = (["rollout generating in the actor processes"] if self.rollout_fused else []) + \
            (["reward scored in the rollout processes"] if self.reward_fused else [])
        self.launched = (f"launched {self.mode}: {', '.join(f'{c} x{ranks[c]}' for c in groups)}"
                         + (f" ({'; '.join(notes)})" if notes else ""))
        """What runs where, in one line: the placement mode, each worker group and its ranks, the fusions."""
        log.info("%s", self.launched)

    # -- the named steps of the loop ---------------------------------------------------------
    def sync_weights(self, version: int | None = None) -> list[GroupHandle]:
        """Start streaming the actor's weights (``version``: the iterations it has trained) to every
        rollout rank (and inference's policy copy).

        Returns the calls' handles without waiting: each worker runs its calls in order, so the
        iteration's work queued behind them starts on the new weights, and the driver saves a round
        trip. ``finish`` (or ``evaluate``) waits for them.
        """
        receivers = [] if self.rollout_fused else [self.rollout.receive_weights(self.names["actor"], 0, version)]
        if self.syncs_inference:
            assert self.inference is not None
            receivers.append(self.inference.receive_weights(self.names["actor"], 0))
        if not receivers:  # the rollout generates from the actor's own weights, and nothing else needs them
            return []
        return [self.actor.send_weights(self.weight_targets), *receivers]

    def score(self, step: int, slots: int) -> GroupHandle | None:
        """The reward workers' scoring of the iteration (None: the rollout scores, fused)."""
        return self.reward.score(step, slots) if self.reward is not None else None

    def log_probs(self, step: int, slots: int) -> GroupHandle | None:
        """Inference's old-policy / reference log-probs for the iteration (None: nothing to compute)."""
        return self.inference.compute(step, slots) if self.inference is not None else None

    def put_prompts(self, step: int, items: Sequence[PromptItem]) -> int:
        """Put an iteration's prompts into the prompts channel; returns how many (the slots)."""
        self.prompts.put_many(PromptTask(step, slot, item.index, list(item.prompt_ids), item.answer)
                              for slot, item in enumerate(items))
        return len(items)

    def starts_by(self, horizon: int) -> bool:
        """Whether an iteration up to ``horizon`` still has to start (then weights are synced first)."""
        return self._next <= horizon

    def start(self, step: int, horizon: int, loader: PromptDataLoader, syncing: Sequence[GroupHandle] = ()) -> int:
        """Queue prompts, generation, scoring and log-probs of every iteration up to ``horizon`` not yet
        started (the first of them behind ``syncing``); returns iteration ``step``'s prompt count."""
        for j in range(max(self._next, step), horizon + 1):
            slots = self.put_prompts(j, loader.next_batch())  # channel "prompts"
            calls = {"rollout": self.rollout.generate(j, slots), "reward": self.score(j, slots),
                     "inference": self.log_probs(j, slots)}
            self._started[j] = _Started(slots, {k: h for k, h in calls.items() if h is not None}, list(syncing))
            syncing = ()
        self._next = max(self._next, horizon + 1)
        return self._started[step].slots

    def in_flight(self, step: int) -> bool:
        """Whether the generation of an iteration past ``step`` has started."""
        return self._next > step + 1

    def finish(self, step: int, **handles: GroupHandle | None) -> dict[str, float]:
        """Wait for iteration ``step``'s generation (and the weight sync before it) and the given calls; one
        dict of metrics (actor: rank 0's, already global)."""
        started = self._started.pop(step)
        named = {**started.calls, **{k: h for k, h in handles.items() if h is not None}}
        results = dict(zip(named, gather([*named.values(), *started.syncing], self.timeout)))
        metrics: dict[str, float] = {}
        for component, per_rank in results.items():
            merged = per_rank[0] if component == "actor" else merge_rank_metrics(per_rank)
            metrics.update({k: v for k, v in merged.items() if k != WEIGHT_KEY})
        return metrics

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        """Throughput of the iteration from its counts and wall time."""
        return {
            "faults/restarts": float(self.restarts),  # the run's restarts so far (a counter, not a rate)
            "time/step": seconds,
            "perf/completions_per_s": metrics.get("rollout/responses_count", 0.0) / seconds,
            "perf/tokens_per_s": metrics.get("rollout/tokens_count", 0.0) / seconds,
        }

    def evaluate(self, syncing: Sequence[GroupHandle] = ()) -> dict[str, float]:
        """Greedy held-out accuracy of the rollout's weights after ``syncing`` (empty without a held-out set)."""
        gather(list(syncing), self.timeout)  # the weights are in place before the clock starts
        if self.test_set is None:
            return {}
        start = time.perf_counter()
        from m2flow.workers.reward import build_reward_fn

        items = list(self.test_set)[: self.cfg.eval_size] if self.cfg.eval_size else list(self.test_set)
        world = self.rollout.world_size
        shares = [items[r::world] for r in range(world)]
        s = self.cfg.rollout.sampling
        out = self.rollout.execute_each(
            "evaluate", [([it.prompt_ids for it in part], s.max_new_tokens, list(s.stop)) for part in shares]).wait()
        texts, lengths, answers = [], [], []
        for part, results in zip(shares, out):
            for it, (text, length) in zip(part, results):
                texts.append(text)
                lengths.append(length)
                answers.append(it.answer)
        if not hasattr(self, "_reward_fn"):
            scoring = self.cfg.reward if self.cfg.eval_reward is None else replace(self.cfg.reward, fn=self.cfg.eval_reward)
            self._reward_fn = build_reward_fn(scoring)
        metrics = score_responses(texts, lengths, answers, self._reward_fn)
        metrics["time/eval"] = time.perf_counter() - start
        return metrics

    def save_checkpoint(self, next_step: int, loader: PromptDataLoader) -> Path:
        """Actor weights + optimizer + RNG (by the actor), data position and step (here). Nothing may be in
        flight (the loop drains first): a checkpoint holds no generated-but-untrained group."""
        if self._next > next_step:
            raise RuntimeError(f"checkpoint at iteration {next_step}: the generation of iteration "
                               f"{self._next - 1} has started (the loop drains before a checkpoint)")
        path = checkpoint_path(self.run_dir, next_step)
        counters = self.actor.save_checkpoint(str(path)).wait()[0]
        write_state(path, {"workflow": "reasoning", "next_step": next_step, "loader": loader.state_dict(),
                           "seed": self.cfg.seed, "actor": counters})
        log.info("checkpoint %s", path)
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        return path

    def shutdown(self) -> None:
        """Close the streams (ending any wait on them), stop every group, then release the streams'
        hosts, so a process that runs many flows keeps no threads or actors of the finished ones."""
        streams = getattr(self, "streams", [])
        for stream in streams:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - the host may be gone already
                pass
        stopped: set[int] = set()
        for name in ("actor", "inference", "reward", "rollout"):
            group = getattr(self, name, None)
            if group is not None and id(group) not in stopped:  # a fused rollout is the actor group
                stopped.add(id(group))
                group.shutdown()
        for stream in streams:
            try:
                stream.destroy()
            except Exception:  # noqa: BLE001 - nothing is left to save; a host already gone is fine
                log.debug("stream %s: releasing its host failed", stream.name, exc_info=True)


# ----------------------------------------------------------------------------- entry points


class ReasoningRun:
    """One run, as a context manager: prepares model and data, plans, launches the flow, shuts it down.

    ``with ReasoningRun(cfg) as run: run.train()``; inside the block ``run.flow`` is the live system
    (tests inspect its workers between iterations) and ``run.plan`` the plan it applies.
    """

    def __init__(self, cfg: ReasoningConfig, cluster: Cluster | None = None, restarts: int = 0) -> None:
        self.cfg = cfg
        self.restarts = restarts
        self.run_dir = Path(cfg.run_dir)
        self.scaffold = RunScaffold(cfg.run_dir, placement=cfg.placement, cluster_config=cfg.cluster,
                                    cluster=cluster, trace=cfg.trace)
        self.flow: ReasoningFlow | None = None
        self.plan: Plan | None = None
        self.start = 0

    def __enter__(self) -> ReasoningRun:
        from m2flow.models.tokenizer import load_tokenizer
        from m2flow.workflows.reasoning_data import load_datasets, prepare_model
        from m2flow.workflows.warm_start import warm_start_model

        cfg = self.cfg
        self.scaffold.__enter__()
        try:
            model_path = prepare_model(cfg.model, cfg.data)
            if cfg.model.warm_start.steps:  # once, here, before any worker loads the model
                model_path = warm_start_model(cfg, model_path)
            train_set, test_set = load_datasets(cfg.data, load_tokenizer(model_path))
            self.loader: PromptDataLoader = PromptDataLoader(train_set, cfg.data.prompts_per_step, seed=cfg.seed,
                                                             shuffle=cfg.data.shuffle)
            resume = find_checkpoint(cfg.resume, cfg.run_dir)
            state: dict[str, Any] = {}
            if resume is not None:
                state = read_state(resume)
                self.start = int(state["next_step"])
                self.loader.load_state_dict(state["loader"])
                truncate_metrics(cfg.run_dir, self.start)  # rows are logged at step = iteration + 1
                log.info("resuming from %s at iteration %d", resume, self.start)
            executor = self.scaffold.executor()
            self.plan = self.scaffold.adopt(plan_reasoning(cfg, executor.layout))
            self.flow = ReasoningFlow(cfg, self.plan, executor, model_path, train_set, test_set, resume,
                                      self.scaffold.trace_dir, actor_counters=state.get("actor"),
                                      start_step=self.start)
            self.flow.restarts = self.restarts
        except BaseException as e:
            self.__exit__(type(e), e, None)
            raise
        return self

    def train(self, watch: Callable[[int, dict[str, float]], bool] | None = None) -> TrainResult:
        """Run the remaining iterations of the loop; metrics go to the configured sinks (``watch``: see
        ``train_loop``)."""
        from m2flow.metrics import MetricsLogger

        assert self.flow is not None, "use ReasoningRun as a context manager"
        cfg = self.cfg
        with MetricsLogger(self.run_dir, cfg.metrics, total_steps=cfg.steps,
                           description=f"reasoning ({self.flow.mode})", run_config=to_dict(cfg)) as logger:
            start = time.perf_counter()
            history = train_loop(self.flow, self.loader, self.start, cfg.steps, logger, cfg.eval_every,
                                 cfg.checkpoint_every, self.scaffold.stop, watch)
            logger.print(summarize(history, self.flow.mode, time.perf_counter() - start, self.run_dir, self.restarts))
        done = sorted((self.run_dir / CHECKPOINTS).glob("step_*"))
        return TrainResult(self.run_dir, self.flow.mode, history, done[-1] if done else None,
                           stopped=self.scaffold.stop.requested, restarts=self.restarts)

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.flow is not None:
                self.flow.shutdown()
                self.flow = None
        finally:
            self.scaffold.__exit__(*exc)


def train(cfg: ReasoningConfig, cluster: Cluster | None = None,
          watch: Callable[[int, dict[str, float]], bool] | None = None) -> TrainResult:
    """Run (or resume) the workflow; ``cluster`` reuses a running one (else Ray starts here). A worker
    that dies or hangs restarts the flow from the newest checkpoint (``fault_tolerance``). With
    ``placement: auto`` the planner chooses the plan first (``auto.py``)."""
    if is_auto(cfg.placement):
        from m2flow.workflows.auto import train_auto

        return train_auto("reasoning", cfg, cluster)

    def attempt(resume: str | None, restarts: int) -> TrainResult:
        with ReasoningRun(replace(cfg, resume=resume), cluster, restarts) as run:
            return run.train(watch)

    return run_with_restarts(attempt, cfg.resume, cfg.run_dir, cfg.fault_tolerance)


def summarize(history: Sequence[dict[str, float]], mode: str, seconds: float, run_dir: Path, restarts: int = 0) -> str:
    """One line: iterations, time, restarts, and where reward and held-out accuracy started and ended."""
    parts = [f"reasoning ({mode}): {len(history)} iteration(s) in {seconds:.1f}s"]
    if restarts:
        parts.append(f"{restarts} restart(s) after a worker died or hung")
    for key in ("reward/mean", "eval/accuracy"):
        seen = [h[key] for h in history if key in h]
        if seen:
            parts.append(f"{key} {seen[0]:.3f} -> {seen[-1]:.3f}")
    return "; ".join(parts) + f"; run directory {run_dir}"


def run_reasoning(cfg: ReasoningConfig) -> int:
    """Entry point of ``m2flow train`` for ``workflow: reasoning``."""
    return EXIT_TERMINATED if train(cfg).stopped else 0


def _register() -> None:
    from m2flow.workflows.registry import register_workflow

    register_workflow("reasoning", ReasoningConfig, run_reasoning, plan=plan_reasoning, graph=GRAPH,
                      search=search_space, auto=auto_support(train))


_register()
