"""The reasoning workflow's live system: worker groups, the streams between them, the data.

One iteration is: the actor's weights to the rollout (and inference's policy copy), the prompts into
the prompts stream, the rollout emitting each group as it finishes, reward scoring what is ready,
inference adding log-probs (when any are needed), the actor training on micro-batches as they come.
The same code runs in every placement: collocated components take turns on shared devices (the
device lock), disaggregated ones overlap; the plan decides which, and which components are fused.

Bounded staleness (the plan's ``max_staleness`` s): the generation of iteration j is queued at
iteration max(0, j - s), behind the weights of that many trained iterations, so the rollout works on
iterations k + 1 .. k + s while the actor trains on k. Each worker runs its calls in order, so which
weights generate which iteration is fixed by the loop, not by timing: a run is reproducible and
every group is at most s versions old (the actor drops and counts any older one).

Partial rollouts (``rollout.partial``, ``m2flow.workers.partial``): an iteration trains on the groups that
finished first, and the responses still generating continue in the next iteration's generation, under the
weights synced before it. Their tokens are then trained one iteration after they were sampled, so the
rollout runs ahead by s - 1 iterations, not s: a response may span two iterations' generations within the
bound (one spanning more starts over). The first iteration of a run puts one batch of prompts more than it
trains on, which the rollout carries from then on. A checkpoint holds what every rollout rank carries
(``PARTIAL_FILE``), and a resumed run gives it back before its first iteration instead of over-provisioning,
so it trains the groups the uninterrupted run trains. With ``rollout.inflight_updates`` a rollout rank
loads weights synced while it generates between decoding steps (``RolloutWorker.poll_weights``); the sync
call queued behind its generation then finds them loaded. When they land depends on timing, so such a run
is not reproducible token for token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.data import PromptDataLoader, PromptDataset, PromptItem
from m2flow.runtime.waiting import gather
from m2flow.driver.workflow import Flow, Launch
from m2flow.planner import Plan
from m2flow.runtime.executors import Executor, Handle
from m2flow.workers.messages import PromptTask
from m2flow.workers.partial import PARTIAL_FILE, share_carried
from m2flow.workers.state_file import load_state, save_state
from m2flow.workers.stats import WEIGHT_KEY, merge_rank_metrics
from m2flow.workflows.reasoning.evaluation import score_responses
from m2flow.workflows.reasoning.graph import GRAPH
from m2flow.workflows.reasoning.settings import ReasoningRun, WorkerSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """What the driver prepares once before any worker starts: the model to load and the data."""

    model_path: Path
    train: PromptDataset
    test: PromptDataset | None


@dataclass
class _Started:
    """An iteration whose generation is queued: its prompt count, its calls and the weight sync before them."""

    slots: int
    calls: dict[str, Handle]
    syncing: list[Handle]


class ReasoningFlow(Flow):
    """The launched system of one run attempt (the driver's ``Flow``)."""

    def __init__(self, workflow: Any, plan: Plan, executor: Executor, run: Launch, *, settings: ReasoningRun,
                 workers: WorkerSettings) -> None:
        """``settings``: what the flow reads of the config; ``workers``: the workers' settings from the
        plan's streams (``worker_settings`` with the config and the plan bound)."""
        prepared: Prepared = run.prepared
        state = run.state or {}
        self.settings, self.plan, self.description = settings, plan, plan.mode
        self.timeout = settings.iteration_timeout_s
        self.test_set = prepared.test
        self.loader = PromptDataLoader(prepared.train, plan.settings["prompts_per_step"], seed=settings.seed,
                                       shuffle=settings.shuffle)
        if "loader" in state:
            self.loader.load_state_dict(state["loader"])
        self.iterations = self.progress_total = settings.steps
        # The iterations generated ahead: max_staleness, one less with partial rollouts (plan.run_ahead).
        self.max_staleness = int(plan.settings.get("run_ahead", plan.settings.get("max_staleness", 0)))
        self.partial = settings.partial
        self._provision = self.partial  # the next iteration puts an extra batch for the rollout to carry
        self._started: dict[int, _Started] = {}
        self._next = self.done = run.start  # the first iteration whose generation is not queued yet; trained
        self._synced: int | None = None  # the weights version the rollout holds, when known
        # The plan's streams (``launch_plan``): a fused reward scores inside the rollout, which then emits
        # scored groups, so "responses" has none; with staleness each iteration in flight has a lane.
        self.launched = workflow.launch_plan(plan, executor, run, lambda wiring: workers(
            str(prepared.model_path), wiring.streams, counters=state.get("actor"), start_step=run.start,
            resume_dir=str(run.checkpoint) if run.checkpoint else None))
        self.names, self.prompts = self.launched.names, self.launched.streams["prompts"]
        self.actor, self.rollout = self.launched["actor"], self.launched["rollout"]  # rollout: maybe in the actor
        self.reward = self.launched["reward"] if plan["reward"].launched else None
        self.inference = self.launched.get("inference")
        self.rollout_fused = plan.fused("rollout")
        ranks = {c: plan[c].world_size for c in GRAPH.component_names}
        self.weight_targets = [] if self.rollout_fused else [(self.names["rollout"], list(range(ranks["rollout"])))]
        self.syncs_inference = self.inference is not None and gather(
            [self.inference.wants_weights(ranks=[0])], self.timeout)[0][0]
        if self.syncs_inference:
            self.weight_targets.append((self.names["inference"], list(range(ranks["inference"]))))
        if run.checkpoint is not None:
            self._restore_partial(Path(run.checkpoint), ranks["rollout"])

    def _restore_partial(self, checkpoint: Path, ranks: int) -> None:
        """Give the rollout ranks the prompts they carried when ``checkpoint`` was saved; then the first iteration
        takes no extra batch (those prompts are the extra batch, already taken from the data)."""
        path = checkpoint / PARTIAL_FILE
        saved: list[list[dict[str, Any]]] | None = load_state(path)["ranks"] if path.exists() else None
        count = sum(len(s) for s in saved or [])
        if not self.partial:
            if count:
                logger.warning("%s holds %d carried prompt(s) of partial rollouts, which are off in this run: they "
                               "are not trained on this epoch", checkpoint, count)
            return
        if saved is None:  # a checkpoint of a run without partial rollouts: start carrying as a fresh run does
            logger.warning("%s holds no carried prompts: the first iteration takes an extra batch", checkpoint)
            return
        if len(saved) != ranks:
            logger.warning("%d carried prompt(s) saved by %d rollout rank(s) dealt round-robin to %d: the run goes on "
                           "with every one of them, though not exactly as it would have", count, len(saved), ranks)
        shares = share_carried(saved, ranks)
        gather([self.rollout.execute_each("restore_partial", [(share,) for share in shares])], self.timeout,
               "restoring the carried prompts")
        self._provision = False

    # -- the named steps of an iteration ----------------------------------------------------------
    def sync_weights(self, version: int) -> list[Handle]:
        """Start streaming the actor's weights (``version``: the iterations it has trained) to every rollout
        rank (and inference's policy copy); the handles, not waited for. Each worker runs its calls in
        order, so the work queued behind them starts on the new weights."""
        self._synced = version
        receivers = [] if self.rollout_fused else [self.rollout.receive_weights(self.names["actor"], 0, version)]
        if self.syncs_inference:
            assert self.inference is not None
            receivers.append(self.inference.receive_weights(self.names["actor"], 0))
        if not receivers:  # the rollout generates from the actor's own weights, and nothing else needs them
            return []
        # The version opens each stream: a rollout loading weights while it generates knows which it took.
        return [self.actor.send_weights(self.weight_targets, version), *receivers]

    def put_prompts(self, step: int, items: Sequence[PromptItem]) -> int:
        """Put an iteration's prompts into the prompts channel; returns how many (the slots)."""
        self.prompts.put_many(PromptTask(step, slot, item.index, list(item.prompt_ids), item.answer)
                              for slot, item in enumerate(items))
        return len(items)

    def start(self, it: int, horizon: int) -> None:
        """Queue prompts, generation, scoring and log-probs of every iteration up to ``horizon`` not yet started,
        the first of them behind the weights of version ``it``."""
        if self._next > horizon:
            return
        syncing = self.sync_weights(it) if self._synced != it else []
        for j in range(max(self._next, it), horizon + 1):
            items = self.loader.next_batch()
            slots = len(items)  # the groups the iteration trains on
            if self._provision:  # slots past the iteration's: prompts for partial rollouts to carry
                items, self._provision = [*items, *self.loader.next_batch()], False
            put = self.put_prompts(j, items)  # channel "prompts"
            generate = self.rollout.generate(j, put, slots) if self.partial else self.rollout.generate(j, slots)
            calls = {"rollout": generate,
                     "reward": self.reward.score(j, slots) if self.reward is not None else None,
                     "inference": self.inference.compute(j, slots) if self.inference is not None else None}
            self._started[j] = _Started(slots, {k: h for k, h in calls.items() if h is not None}, list(syncing))
            syncing = []
        self._next = max(self._next, horizon + 1)

    def finish(self, it: int) -> dict[str, float]:
        """Train on iteration ``it`` as its groups arrive; one dict of metrics (the actor's: rank 0's, global)."""
        started = self._started.pop(it)
        named = {**started.calls, "actor": self.actor.train(it, started.slots)}
        results = dict(zip(named, gather([*named.values(), *started.syncing], self.timeout, f"iteration {it}")))
        metrics: dict[str, float] = {}
        for component, per_rank in results.items():
            merged = per_rank[0] if component == "actor" else merge_rank_metrics(per_rank)
            metrics.update({k: v for k, v in merged.items() if k != WEIGHT_KEY})
        self.done = it + 1
        return metrics

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        """Throughput of the iteration from its counts and wall time."""
        return {
            "time/step": seconds,
            "perf/completions_per_s": metrics.get("rollout/responses_count", 0.0) / seconds,
            "perf/tokens_per_s": metrics.get("rollout/tokens_count", 0.0) / seconds,
        }

    def in_flight(self, it: int) -> bool:
        """Whether the generation of an iteration past ``it`` has started."""
        return self._next > it + 1

    def evaluate(self) -> dict[str, float]:
        """Greedy held-out accuracy of the actor's current weights, generated by the rollout (empty without a
        held-out set)."""
        syncing = self.sync_weights(self.done) if self._synced != self.done else []
        gather(syncing, self.timeout, "the weight sync before an evaluation")  # the weights are in place first
        if self.test_set is None:
            return {}
        start = time.perf_counter()
        from m2flow.workers.reward import build_reward_fn

        run = self.settings
        items = list(self.test_set)[: run.eval_size] if run.eval_size else list(self.test_set)
        world = self.rollout.world_size
        shares = [items[r::world] for r in range(world)]
        handle = self.rollout.execute_each(
            "evaluate", [([it.prompt_ids for it in part], run.eval_max_new_tokens, list(run.eval_stop))
                         for part in shares])
        out = gather([handle], self.timeout, "the held-out evaluation")[0]
        texts, lengths, answers = [], [], []
        for part, results in zip(shares, out):
            for it, (text, length) in zip(part, results):
                texts.append(text)
                lengths.append(length)
                answers.append(it.answer)
        if not hasattr(self, "_reward_fn"):
            self._reward_fn = build_reward_fn(run.eval_reward)
        metrics = score_responses(texts, lengths, answers, self._reward_fn)
        metrics["time/eval"] = time.perf_counter() - start
        return metrics

    def save(self, path: Path) -> dict[str, Any]:
        """Actor weights + optimizer + RNG (by the actor); with partial rollouts what every rollout rank carries
        (``PARTIAL_FILE``); the data position and the actor's counters (returned). Nothing may be in flight (the
        loop drains first): a checkpoint holds no generated-but-untrained group."""
        if self._next > self.done:
            raise RuntimeError(f"checkpoint after iteration {self.done}: the generation of iteration "
                               f"{self._next - 1} has started (the loop drains before a checkpoint)")
        counters = gather([self.actor.save_checkpoint(str(path))], self.timeout, "a checkpoint")[0][0]
        if self.partial:  # per rank, in rank order; the rollout keeps carrying them
            carried = gather([self.rollout.partial_state()], self.timeout, "a checkpoint")[0]
            Path(path).mkdir(parents=True, exist_ok=True)
            save_state({"ranks": carried}, Path(path) / PARTIAL_FILE)
            logger.info("checkpoint after iteration %d: %d carried prompt(s) of partial rollouts saved", self.done,
                        sum(len(rank) for rank in carried))
        return {"loader": self.loader.state_dict(), "actor": counters}

    def summary(self, history: list[dict[str, float]]) -> str:
        """Iterations, and where reward and held-out accuracy started and ended."""
        parts = [f"reasoning ({self.plan.mode}): {len(history)} iteration(s)"]
        for key in ("reward/mean", "eval/accuracy"):
            seen = [h[key] for h in history if key in h]
            if seen:
                parts.append(f"{key} {seen[0]:.3f} -> {seen[-1]:.3f}")
        return "; ".join(parts)
