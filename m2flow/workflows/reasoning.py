"""The reasoning RL workflow (``workflow: reasoning``): the macro loop, and what launches it.

``train_loop`` is the whole algorithm as a short sequence of named steps. It is the same for every
placement: collocated components take turns on their shared devices (the device lock), while
disaggregated or hybrid ones overlap, each consuming the groups the previous stage emits as soon
as they are ready. Which of those happens is decided by the placement alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from m2flow.config.convert import to_dict
from m2flow.data import PromptDataLoader, PromptDataset, PromptItem
from m2flow.workflows.evaluation import score_responses
from m2flow.workflows.reasoning_config import COMPONENTS, ReasoningConfig
from m2flow.runtime import Cluster, GroupHandle, WorkerGroup
from m2flow.runtime.executors import Executor, GroupSpec, RayExecutor
from m2flow.runtime.trace import (
    ProcessInfo,
    configure_tracer,
    get_tracer,
    merge_traces,
    prepare_trace_dir,
    set_tracer,
)
from m2flow.workers.messages import PromptTask
from m2flow.workers.stats import WEIGHT_KEY, merge_rank_metrics
from m2flow.workers.streams import GroupStream

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"


@dataclass
class TrainResult:
    """What a run did: its directory, the metrics of every iteration, its last checkpoint."""

    run_dir: Path
    mode: str
    history: list[dict[str, float]] = field(default_factory=list)
    last_checkpoint: Path | None = None


# ----------------------------------------------------------------------------- the macro loop


def train_loop(flow: ReasoningFlow, loader: PromptDataLoader, start: int, steps: int, logger: Any,
               eval_every: int = 0, checkpoint_every: int = 0) -> list[dict[str, float]]:
    """Iterations ``start .. steps - 1`` of: sync, generate, score, log-probs, train, log, checkpoint."""
    history = []
    for step in range(start, steps):
        t0 = time.perf_counter()
        with get_tracer().span("step", cat="step", step=step):
            syncing = flow.sync_weights()                            # actor -> rollout, inference
            evaluated = flow.evaluate(syncing) if eval_every and step % eval_every == 0 else {}
            slots = flow.put_prompts(step, loader.next_batch())      # channel "prompts"
            metrics = flow.finish(
                syncing,                                             # each worker loads, then goes on
                rollout=flow.rollout.generate(step, slots),          # emits each group when done
                reward=flow.score(step, slots),                      # scores what is ready (or fused)
                inference=flow.log_probs(step, slots),               # old / reference log-probs, if any
                actor=flow.actor.train(step, slots),                 # trains on micro-batches as they come
            )
        # Held-out evaluation is timed on its own, so time/step and the rates describe training only.
        seconds = time.perf_counter() - t0 - evaluated.get("time/eval", 0.0)
        metrics.update(evaluated, **flow.rates(metrics, seconds))
        logger.log(metrics, step=step + 1)
        history.append(metrics)
        if checkpoint_every and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
            flow.save_checkpoint(step + 1, loader)
    if eval_every:
        final = flow.evaluate(flow.sync_weights())
        logger.log(final, step=steps)
        if history:  # the last entry describes the policy after the last update
            history[-1].update(final)
    return history


# ----------------------------------------------------------------------------- the running system


def _gather(handles: Sequence[GroupHandle]) -> list[list[Any]]:
    """Results of every handle; the first failure anywhere raises at once (others would wait forever)."""
    async def all_of() -> list[list[Any]]:
        return list(await asyncio.gather(*handles))

    return asyncio.run(all_of())


def _shares_devices(plan: Any, component: str, holders: Sequence[str]) -> bool:
    """True when another of the device-holding components ``holders`` runs on some of ``component``'s devices."""
    mine = plan[component].devices
    return any(mine & plan[c].devices for c in holders if c != component)


def rollout_fuses_with_actor(cfg: ReasoningConfig, plan: Any) -> bool:
    """Whether the rollout generates inside the actor processes (``rollout.fuse_with_actor``): same devices
    rank for rank, full weights on every actor rank (ddp), an in-process backend and the same dtype."""
    from m2flow.backends.generation import IN_PROCESS_BACKENDS

    return (cfg.rollout.fuse_with_actor and plan["rollout"].same_devices(plan["actor"])
            and cfg.actor.strategy == "ddp" and cfg.rollout.backend in IN_PROCESS_BACKENDS
            and cfg.rollout.dtype == cfg.actor.dtype)


class ReasoningFlow:
    """The launched system of one run: worker groups, the streams between them, and the data."""

    def __init__(self, cfg: ReasoningConfig, executor: Executor, model_path: Path, train: PromptDataset,
                 test: PromptDataset | None, resume_dir: Path | None = None, trace_dir: Path | None = None) -> None:
        from m2flow.workers.actor import ActorWorker
        from m2flow.workers.inference import InferenceWorker
        from m2flow.workers.reward import RewardWorker
        from m2flow.workers.rollout import RolloutWorker

        self.cfg = cfg
        self.train_set = train
        self.test_set = test
        self.run_dir = Path(cfg.run_dir)
        plan = executor.placement(cfg.placement, components=COMPONENTS)
        self.mode = plan.mode
        rid = uuid.uuid4().hex[:8]
        ranks = {c: plan[c].world_size for c in COMPONENTS}
        # One stream per edge of the workflow; each routes a group to rank slot % (consumer ranks).
        self.prompts = GroupStream.create(f"prompts-{rid}", ranks["rollout"])
        ready = GroupStream.create(f"ready-{rid}", ranks["actor"])
        # Inference runs only when it has log-probs to compute; otherwise scored groups go straight
        # to the actor, one hop (a serialisation and a wake-up per group) fewer.
        algo = cfg.algorithm
        self.infers = algo.old_logprobs == "inference" or algo.needs_reference
        scored = GroupStream.create(f"scored-{rid}", ranks["inference"]) if self.infers else ready
        # Reward on the rollout's own devices scores inside the rollout process: one hop fewer again.
        self.reward_fused = cfg.reward.fuse_with_rollout and plan["reward"].same_devices(plan["rollout"])
        # Rollout on the actor's own devices, rank for rank, generates inside the actor processes from
        # the policy being trained: no weight sync to it and no second copy of the model.
        self.rollout_fused = rollout_fuses_with_actor(cfg, plan)
        responses = scored if self.reward_fused else GroupStream.create(f"responses-{rid}", ranks["reward"])
        self.streams = list({id(s): s for s in (self.prompts, responses, scored, ready)}.values())
        n = cfg.rollout.sampling.n
        temperature = cfg.rollout.sampling.temperature
        holders = (["actor"] if self.rollout_fused else ["rollout", "actor"]) + (["inference"] if self.infers else [])
        shares = {c: _shares_devices(plan, c, holders) for c in COMPONENTS}
        path = str(model_path)
        scoring = {"max_new_tokens": cfg.rollout.sampling.max_new_tokens, "dynamic_sampling": algo.dynamic_sampling}
        fused_scorer = {"cfg": cfg.reward, **scoring} if self.reward_fused else None
        specs: dict[str, GroupSpec] = {
            "rollout": GroupSpec(RolloutWorker, (path, cfg.rollout, self.prompts, responses),
                                 {"seed": cfg.seed, "shares_devices": shares["rollout"], "scorer": fused_scorer},
                                 cfg.rollout.num_threads),
            "reward": GroupSpec(RewardWorker, (cfg.reward, responses, scored), scoring, cfg.reward.num_threads),
            "inference": GroupSpec(InferenceWorker, (path, cfg.inference, cfg.algorithm, temperature, n, scored, ready),
                                   {"shares_devices": shares["inference"]}, cfg.inference.num_threads),
            "actor": GroupSpec(ActorWorker, (path, cfg.actor, cfg.algorithm, temperature, n, ready),
                               {"total_steps": cfg.steps, "seed": cfg.seed, "shares_devices": shares["actor"],
                                "resume_dir": str(resume_dir) if resume_dir else None}, cfg.actor.num_threads),
        }
        if self.rollout_fused:
            del specs["rollout"]
            specs["actor"].kwargs["generation"] = {"cfg": cfg.rollout, "prompts": self.prompts, "responses": responses,
                                               "seed": cfg.seed, "scorer": fused_scorer}
        if not self.infers:
            del specs["inference"]
        if self.reward_fused:
            del specs["reward"]
        self.names = {c: f"{c}-{rid}" for c in COMPONENTS}
        groups = executor.launch(self.names, plan, specs, self.run_dir / "logs", trace_dir)
        self.actor = groups["actor"]
        self.rollout = self.actor if self.rollout_fused else groups["rollout"]
        self.reward: WorkerGroup | None = groups.get("reward")
        self.inference: WorkerGroup | None = groups.get("inference")
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
    def sync_weights(self) -> list[GroupHandle]:
        """Start streaming the actor's weights to every rollout rank (and inference's policy copy).

        Returns the calls' handles without waiting: each worker runs its calls in order, so the
        iteration's work queued behind them starts on the new weights, and the driver saves a round
        trip. ``finish`` (or ``evaluate``) waits for them.
        """
        receivers = [] if self.rollout_fused else [self.rollout.receive_weights(self.names["actor"], 0)]
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

    def finish(self, syncing: Sequence[GroupHandle] = (), **handles: GroupHandle | None) -> dict[str, float]:
        """Wait for the weight sync and the iteration's calls; one dict of metrics (actor: rank 0's,
        already global)."""
        named = {k: h for k, h in handles.items() if h is not None}
        results = dict(zip(named, _gather([*named.values(), *syncing])))
        metrics: dict[str, float] = {}
        for component, per_rank in results.items():
            merged = per_rank[0] if component == "actor" else merge_rank_metrics(per_rank)
            metrics.update({k: v for k, v in merged.items() if k != WEIGHT_KEY})
        return metrics

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        """Throughput of the iteration from its counts and wall time."""
        return {
            "time/step": seconds,
            "perf/completions_per_s": metrics.get("rollout/responses_count", 0.0) / seconds,
            "perf/tokens_per_s": metrics.get("rollout/tokens_count", 0.0) / seconds,
        }

    def evaluate(self, syncing: Sequence[GroupHandle] = ()) -> dict[str, float]:
        """Greedy held-out accuracy of the rollout's weights after ``syncing`` (empty without a held-out set)."""
        _gather(list(syncing))  # the weights are in place before the clock starts
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
        """Actor weights + optimizer + RNG (by the actor), data position and step (here)."""
        path = self.run_dir / CHECKPOINTS / f"step_{next_step:06d}"
        self.actor.save_checkpoint(str(path)).wait()
        state = {"next_step": next_step, "loader": loader.state_dict(), "seed": self.cfg.seed}
        (path / TRAINER_STATE).write_text(json.dumps(state, indent=1))
        log.info("checkpoint %s", path)
        return path

    def shutdown(self) -> None:
        """Close the streams (ending any wait on them), then stop every group."""
        for stream in getattr(self, "streams", []):
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


# ----------------------------------------------------------------------------- entry points


def find_checkpoint(cfg: ReasoningConfig) -> Path | None:
    """The checkpoint to resume from: ``resume`` itself, or the latest complete one in run_dir."""
    if cfg.resume is None:
        return None
    if cfg.resume != "auto":
        path = Path(cfg.resume)
        if not (path / TRAINER_STATE).is_file():
            raise FileNotFoundError(f"resume: {path} is not a checkpoint (no {TRAINER_STATE})")
        return path
    done = sorted(p for p in (Path(cfg.run_dir) / CHECKPOINTS).glob("step_*") if (p / TRAINER_STATE).is_file())
    return done[-1] if done else None


class ReasoningRun:
    """One run, as a context manager: prepares model and data, launches the flow, shuts it down.

    ``with ReasoningRun(cfg) as run: run.train()``; inside the block ``run.flow`` is the live system
    (tests inspect its workers between iterations).
    """

    def __init__(self, cfg: ReasoningConfig, cluster: Cluster | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self._cluster = cluster
        self.flow: ReasoningFlow | None = None
        self.start = 0
        self.trace_dir: Path | None = None

    def __enter__(self) -> ReasoningRun:
        from m2flow.models.tokenizer import load_tokenizer
        from m2flow.workflows.reasoning_data import load_datasets, prepare_model
        from m2flow.workflows.warm_start import warm_start_model
        from m2flow.runtime.logs import setup_logging

        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(log_file=self.run_dir / "driver.log", console=False)
        model_path = prepare_model(cfg.model, cfg.data)
        if cfg.model.warm_start.steps:  # once, here, before any worker loads the model
            model_path = warm_start_model(cfg, model_path)
        train_set, test_set = load_datasets(cfg.data, load_tokenizer(model_path))
        self.loader: PromptDataLoader = PromptDataLoader(train_set, cfg.data.prompts_per_step, seed=cfg.seed,
                                                         shuffle=cfg.data.shuffle)
        resume = find_checkpoint(cfg)
        if resume is not None:
            state = json.loads((resume / TRAINER_STATE).read_text())
            self.start = int(state["next_step"])
            self.loader.load_state_dict(state["loader"])
            log.info("resuming from %s at iteration %d", resume, self.start)
        if cfg.trace:
            self.trace_dir = prepare_trace_dir(self.run_dir)
            configure_tracer(self.trace_dir, ProcessInfo())
        self.executor: Executor = RayExecutor(cfg.cluster, self._cluster)
        try:
            self.flow = ReasoningFlow(cfg, self.executor, model_path, train_set, test_set, resume, self.trace_dir)
        except BaseException:
            self.__exit__()
            raise
        return self

    def train(self) -> TrainResult:
        """Run the remaining iterations of the loop; metrics go to the configured sinks."""
        from m2flow.metrics import MetricsLogger

        assert self.flow is not None, "use ReasoningRun as a context manager"
        cfg = self.cfg
        with MetricsLogger(self.run_dir, cfg.metrics, total_steps=cfg.steps,
                           description=f"reasoning ({self.flow.mode})", run_config=to_dict(cfg)) as logger:
            start = time.perf_counter()
            history = train_loop(self.flow, self.loader, self.start, cfg.steps, logger, cfg.eval_every,
                                 cfg.checkpoint_every)
            logger.print(summarize(history, self.flow.mode, time.perf_counter() - start, self.run_dir))
        done = sorted((self.run_dir / CHECKPOINTS).glob("step_*"))
        return TrainResult(self.run_dir, self.flow.mode, history, done[-1] if done else None)

    def __exit__(self, *exc: object) -> None:
        if self.flow is not None:
            self.flow.shutdown()
            self.flow = None
        if getattr(self, "executor", None) is not None:
            self.executor.shutdown()
        if self.trace_dir is not None:
            get_tracer().close()
            set_tracer(None)
            merge_traces(self.run_dir)
            self.trace_dir = None


def train(cfg: ReasoningConfig, cluster: Cluster | None = None) -> TrainResult:
    """Run (or resume) the workflow; ``cluster`` reuses a running one (else Ray starts here)."""
    with ReasoningRun(cfg, cluster) as run:
        return run.train()


def summarize(history: Sequence[dict[str, float]], mode: str, seconds: float, run_dir: Path) -> str:
    """One line: iterations, time, and where reward and held-out accuracy started and ended."""
    parts = [f"reasoning ({mode}): {len(history)} iteration(s) in {seconds:.1f}s"]
    for key in ("reward/mean", "eval/accuracy"):
        seen = [h[key] for h in history if key in h]
        if seen:
            parts.append(f"{key} {seen[0]:.3f} -> {seen[-1]:.3f}")
    return "; ".join(parts) + f"; run directory {run_dir}"


def run_reasoning(cfg: ReasoningConfig) -> int:
    """Entry point of ``m2flow train`` for ``workflow: reasoning``."""
    train(cfg)
    return 0


def _register() -> None:
    from m2flow.workflows.registry import register_workflow

    register_workflow("reasoning", ReasoningConfig, run_reasoning)


_register()
