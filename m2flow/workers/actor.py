"""``ActorWorker``: policy (and, for PPO, critic) updates from the groups routed to this rank.

Two ways through an iteration, chosen once from the config:

- **streaming** (group-local advantages such as GRPO/RLOO, no critic, one optimizer step per
  iteration, replicated weights): each micro-batch gets its advantages and a forward/backward in
  its own device turn as soon as it arrives, overlapping generation of the rest; gradients
  accumulate and one optimizer step closes the iteration. On devices of its own the actor takes
  whatever groups are ready (elastic micro-batches); on devices shared with generation it waits
  for full micro-batches, since a pass there cannot overlap anything;
- **gathered** (PPO's critic, batch-wide whitening as in REINFORCE++, several mini-batches or
  epochs, or FSDP's lockstep passes): all groups are taken first, then values, advantages and the
  mini-batch updates run in one device turn.

Micro-batches hold ``micro_batch_size`` responses or, with ``micro_batch_tokens``, whole groups up to
that many real tokens (gathered: rows). Losses are sums scaled once by the global token or sequence
count (see ``objective.py``), so both ways, and any micro-batching, give the same update. Before any step that synchronises ranks, every
rank waits on a host barrier without holding its devices: a rank holding the device lock while
waiting for a peer whose data still needs that device would deadlock a collocated placement.

Bounded staleness (the plan's ``max_staleness`` s > 0, ``ActorSettings.max_staleness``): every group
carries the policy version that generated it; a group more than s versions older than this actor (the
iterations it has trained) is marked dropped and counted (``async/dropped_samples``), never trained on,
and the others are trained with the decoupled PPO objective against their behaviour log-probs
(``objective.policy_objective(version=...)``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from m2flow.algorithms.offpolicy import split_by_staleness, staleness_metrics
from m2flow.backends.training.collectives import all_reduce_max, all_reduce_sum, barrier, use_host_sum
from m2flow.data.batch import RolloutBatch
from m2flow.models.causal_lm import CausalLMWithValueHead, load_causal_lm, response_logprobs
from m2flow.models.response_forward import create_response_forward
from m2flow.models.rng import global_rng_state, seed_global_rngs, set_global_rng_state
from m2flow.models.tokenizer import load_tokenizer
from m2flow.runtime.comm import send_weights
from m2flow.runtime.comm.collectives import ExchangeSum
from m2flow.runtime.errors import RunHealthError
from m2flow.runtime.trace import trace_category
from m2flow.workers.actor_files import ACTOR_DIR, CRITIC_DIR, SHARDS, is_sharded, save_value_model
from m2flow.workers.common import ReasoningWorker, state_digest
from m2flow.workers.config import ActorConfig, AlgorithmConfig, torch_dtype, uses_exchange
from m2flow.workers.estimator_bridge import fill_advantages
from m2flow.workers.messages import GroupSample, group_tokens, join_groups
from m2flow.workers.objective import StepTotals, critic_objective, policy_objective
from m2flow.workers.state_file import load_state, save_state
from m2flow.workers.stats import WEIGHT_KEY
from m2flow.runtime.streams import GroupStream
from m2flow.workers.trainable import TrainedModel

TRAINING_STATE = "training_state.pt"
RECEIVED_LOG = 1 << 16  # groups kept in the log of taken groups (a long run would grow it without end)


@dataclass(frozen=True, kw_only=True)
class ActorSettings:
    """The actor: the policy (and critic) it trains, on what, in the plan's micro-batches, from where it resumes."""

    model_path: str
    actor: ActorConfig  # strategy, optimizers, updates (its micro-batch keys are the plan's, below)
    algo: AlgorithmConfig
    temperature: float
    group_size: int
    ready: GroupStream
    total_steps: int
    seed: int = 0
    micro_batch_size: int = 16
    micro_batch_tokens: int | None = None
    max_staleness: int = 0
    """the plan's bound on how many versions old a trained group may be (0: synchronous)"""
    shares_devices: bool = False
    offload: bool = False
    resume_dir: str | None = None  # the checkpoint directory it resumes from
    counters: dict[str, int] = field(default_factory=dict)  # what ``save_checkpoint`` returned there
    start_step: int = 0  # the iteration this attempt starts at (the version a hosted rollout generates with)


class ActorWorker(ReasoningWorker):
    """Trains the policy on the groups routed to this rank; rank 0 streams weights to the generators.

    With the rollout hosted (fused into this process by the plan) it also generates, from the very policy it
    trains: the hosted ``Generation`` borrows the policy and tokenizer (``lent_model``).
    """

    def __init__(self, *, settings: ActorSettings, hosted: Mapping[str, Any] | None = None) -> None:
        s = settings
        cfg, algo, model_path, seed, resume_dir = s.actor, s.algo, s.model_path, s.seed, s.resume_dir
        self.cfg, self.algo = cfg, algo
        self.max_staleness = s.max_staleness
        self.policy_version = s.start_step  # iterations trained: the version a fused rollout generates with
        self.inp: GroupStream = s.ready
        self.shares_devices, self.offloads = s.shares_devices, s.offload
        self.temperature = s.temperature if s.temperature > 0 else 1.0
        self.micro_batch_size, self.micro_batch_tokens = s.micro_batch_size, s.micro_batch_tokens
        self.groups_per_micro_batch = max(1, s.micro_batch_size // s.group_size)
        seed_global_rngs(seed)  # the same on every rank: a fresh value head starts identical
        if self.world_size > 1:
            self.init_process_group()
            if uses_exchange(cfg.host_sum, self.world_size, self.torch_device.type):
                use_host_sum(ExchangeSum(self.comm, self.group_name, self.rank, self.world_size))
        # A sharded checkpoint holds no whole weights: build from the model, then fill in the shards.
        whole = resume_dir is not None and not is_sharded(Path(resume_dir))
        source = Path(resume_dir) / ACTOR_DIR if whole else Path(model_path)
        device, dtype = self.torch_device, torch_dtype(cfg.dtype)
        updates = s.total_steps * cfg.mini_batches * cfg.update_epochs
        self.tokenizer = load_tokenizer(model_path)
        model = load_causal_lm(source, dtype=dtype, device=device)
        self.forward = create_response_forward(cfg.forward)  # the forward of the policy's log-probs
        self.forward.check(model)  # an unsupported model fails here, not in the first iteration
        self.policy = TrainedModel(model, cfg.strategy, device, cfg.optim, updates, cpu_offload=cfg.fsdp_cpu_offload)
        self.critic: TrainedModel | None = None
        if algo.uses_critic:
            critic_source = Path(resume_dir) / CRITIC_DIR if whole else Path(cfg.critic.path or model_path)
            value_model = CausalLMWithValueHead.from_pretrained(critic_source, dtype=dtype).to(device)
            self.critic = TrainedModel(value_model, cfg.strategy, device, cfg.critic.optim, updates,
                                       cpu_offload=cfg.fsdp_cpu_offload)
        # (step, slot, dataset index, trained) of the latest groups taken, for checks and tests
        self.received: deque[tuple[int, int, int, bool]] = deque(maxlen=RECEIVED_LOG)
        # optimizer steps skipped in a row for a non-finite loss or gradient (kept in trainer_state.json)
        self.skipped_in_row = int(s.counters.get("skipped_in_row", 0))
        self.streaming = (algo.group_local and self.critic is None and cfg.updates_once
                          and not self.policy.strategy.lockstep)
        if resume_dir:
            self._load_training_state(Path(resume_dir))
        self.host_components(hosted)  # the rollout (and a reward fused into it), when the plan fuses them here
        gen = self.hosted("rollout")
        if gen is not None and gen.responses.name == self.inp.name and \
                gen.responses.consumers == gen.prompts.consumers == self.world_size:
            # Generation feeds this rank's own training: rank r generates the slots r (mod ranks) and
            # trains on exactly those, after generating them. They need not leave the process.
            self.inp.keep_local(self.rank)

    def lent_model(self) -> tuple[Any, Any]:
        """The policy it trains and its tokenizer, for a rollout hosted here to generate from."""
        return self.policy.module, self.tokenizer

    # -- context switching ------------------------------------------------------------------
    def offload(self) -> None:
        for m in self._trained():
            m.offload()

    def onload(self) -> None:
        for m in self._trained():
            m.onload()

    def _trained(self) -> list[TrainedModel]:
        return [self.policy] + ([self.critic] if self.critic is not None else [])

    # -- weights -----------------------------------------------------------------------------
    @trace_category("weight_sync")
    def send_weights(self, targets: list[tuple[str, list[int]]], version: int | None = None) -> int:
        """Stream the policy weights to ranks of other groups (every actor rank calls; rank 0 sends); ``version``
        (iterations trained) opens each stream, for a rollout that loads weights while it generates."""
        with self.tracer.span("send_weights", cat="weight_sync"):
            state = self.policy.full_state_dict()
            if self.rank == 0:
                for group, ranks in targets:
                    send_weights(self.comm, state, group, ranks, bucket_bytes=self.cfg.weight_sync_bucket_mb << 20,
                                 version=version)
        return len(state)

    def weights_digest(self) -> str:
        """Digest of the full policy weights (every rank calls under FSDP; rank 0's is complete)."""
        return state_digest(self.policy.full_state_dict())

    # -- the step ----------------------------------------------------------------------------
    @trace_category("train")
    def train(self, step: int, num_slots: int) -> dict[str, float]:
        """Update on this rank's groups of iteration ``step``; returns actor (and critic) metrics."""
        expected = self.inp.expected(self.rank, num_slots)
        start = time.perf_counter()
        self._busy = 0.0
        self.policy_version = step  # iterations trained so far
        self._ages = [0] * (self.max_staleness + 2)  # responses by age 0..s, then those dropped as too old
        self._waited = 0.0
        if self.streaming:
            metrics = self._train_streaming(step, expected)
        else:
            metrics = self._train_gathered(step, expected)
        metrics["time/train"] = time.perf_counter() - start  # waits for groups and device turns included
        metrics["time/train_busy"] = self._busy  # computing only: what a cost model prices
        metrics["time/actor_wait_s"] = self._waited
        if self.max_staleness > 0:
            counts = all_reduce_sum([float(c) for c in self._ages])  # by age 0..s, then dropped
            metrics.update(staleness_metrics(counts[:-1], counts[-1]))
        metrics[WEIGHT_KEY] = 1.0
        self.policy_version = step + 1
        return metrics

    def _take(self, step: int, count: int, ready: bool = False) -> list[GroupSample]:
        """``count`` groups of iteration ``step`` (``ready``: 1 to ``count`` of what is there), checked and
        logged; the time spent waiting for them counts in ``time/actor_wait_s``."""
        t0 = time.perf_counter()
        groups = (self.inp.take_ready if ready else self.inp.take)(self.rank, count, step)
        self._waited += time.perf_counter() - t0
        return self._accept(step, groups)

    def _train_streaming(self, step: int, expected: int) -> dict[str, float]:
        totals = StepTotals()
        remaining = expected
        while remaining:
            groups = self._take_micro_batch(step, remaining)
            remaining -= len(groups)
            live = [g for g in groups if not g.dropped]
            if not live:
                continue
            batch = join_groups(live)
            fill_advantages(batch, self.algo)
            # Not the last turn: the devices are released between micro-batches, the memory is kept.
            with self.turn(last=False), self.tracer.span("train", cat="train", step=step, groups=len(live)):
                t0 = time.perf_counter()
                self._backward(batch, totals, last=False)
                self._busy += time.perf_counter() - t0
        # The reduce below is a host-side collective: it is also the barrier before the device turn.
        count, metrics = StepTotals.summarize(all_reduce_sum(totals.as_vector()))
        with self.turn(), self.tracer.span("optimizer_step", cat="train", step=step):
            t0 = time.perf_counter()
            metrics.update(self._update(count, _losses_finite(metrics)))
            self._busy += time.perf_counter() - t0
        return metrics

    def _take_micro_batch(self, step: int, remaining: int) -> list[GroupSample]:
        """The groups of iteration ``step``'s next streamed micro-batch, checked and logged:
        ``micro_batch_tokens`` tokens' worth when set, else ``micro_batch_size`` responses' worth. On
        devices shared with generation a pass overlaps nothing, so a partial micro-batch only adds
        passes: wait for a full one. On devices of its own, train on whatever is ready. The time spent
        waiting counts in ``time/actor_wait_s``."""
        t0 = time.perf_counter()
        budget = self.micro_batch_tokens
        if budget is not None:
            groups = self.inp.take_tokens(self.rank, remaining, budget, group_tokens, wait=self.shares_devices,
                                          step=step)
        else:
            limit = min(self.groups_per_micro_batch, remaining)
            take = self.inp.take if self.shares_devices else self.inp.take_ready
            groups = take(self.rank, limit, step)
        self._waited += time.perf_counter() - t0
        return self._accept(step, groups)

    def _train_gathered(self, step: int, expected: int) -> dict[str, float]:
        groups = self._take(step, expected)
        live = [g for g in groups if not g.dropped]
        barrier()  # every rank holds its data: nothing upstream needs a device from here on
        metrics: dict[str, float] = {}
        with self.turn(), self.tracer.span("train", cat="train", step=step, groups=len(live)):
            t0 = time.perf_counter()
            batch = join_groups(live) if live else None
            dummy = join_groups(groups[:1]) if groups else None  # input for lockstep padding passes
            if self.critic is not None:
                values = self._values(batch, dummy)
                if batch is not None:
                    batch.values = values
            if batch is not None:
                fill_advantages(batch, self.algo)
            for _ in range(self.cfg.update_epochs):
                for mini in _split(batch, self.cfg.mini_batches):
                    metrics = self._mini_batch_update(mini, dummy)
            self._busy += time.perf_counter() - t0
        return metrics

    def _accept(self, step: int, groups: list[GroupSample]) -> list[GroupSample]:
        """Check that the groups belong to this iteration, drop those older than ``max_staleness`` and
        log them in ``received``. (Staleness 0 is the synchronous flow: every group is fresh by
        construction, since generation waits for the weight sync, so versions are not consulted.)"""
        for g in groups:
            if g.step != step:
                raise RuntimeError(f"actor rank {self.rank} got a group of iteration {g.step} during {step}")
        if self.max_staleness > 0 and groups:
            try:  # version = iterations trained
                split = split_by_staleness(step, [g.version for g in groups], [g.size for g in groups],
                                           self.max_staleness)
            except ValueError as e:
                raise RuntimeError(f"actor rank {self.rank} at version {step}, iteration {step}: {e}") from None
            for g, ok in zip(groups, split.fresh):
                g.dropped = not ok  # older than the bound: passed over, never trained on
            for age, size in enumerate(split.by_age):
                self._ages[age] += size
            self._ages[-1] += split.dropped
        for g in groups:
            self.received.append((g.step, g.slot, g.index, not g.dropped))
        return groups

    def received_groups(self) -> list[tuple[int, int, int, bool]]:
        """The groups this rank took, the latest ``RECEIVED_LOG`` of them: (iteration, slot, dataset index,
        trained on)."""
        return list(self.received)

    def _mini_batch_update(self, mini: RolloutBatch | None, dummy: RolloutBatch | None) -> dict[str, float]:
        micro: list[RolloutBatch] = []
        if mini is not None and len(mini):
            budget = self.micro_batch_tokens
            micro = mini.split_tokens(budget) if budget is not None else mini.split(self.micro_batch_size)
        rounds = len(micro)
        if self.policy.strategy.lockstep:  # every rank runs as many passes as the busiest one
            rounds = int(all_reduce_max([len(micro)])[0])
        totals = StepTotals()
        for i in range(rounds):
            last = i == rounds - 1
            if i < len(micro):
                self._backward(micro[i], totals, last)
            else:
                self._backward(micro[0] if micro else _with_zero_advantages(dummy), totals, last, weight=0.0)
        count, metrics = StepTotals.summarize(all_reduce_sum(totals.as_vector()))
        metrics.update(self._update(count, _losses_finite(metrics)))
        return metrics

    def _backward(self, batch: RolloutBatch, totals: StepTotals, last: bool, weight: float = 1.0) -> None:
        """Forward and backward of one micro-batch, gradients accumulated (``weight`` 0: a padding pass)."""
        batch = batch.to(self.torch_device)
        need_entropy = self.algo.entropy_coef > 0
        with self.policy.strategy.accumulate(last):
            logp, entropy = response_logprobs(
                self.policy.module, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                batch.response_mask, temperature=self.temperature, return_entropy=need_entropy,
                forward=self.forward)
            obj = policy_objective(logp, entropy, batch, self.algo,
                                   version=self.policy_version if self.max_staleness > 0 else None)
            (obj.loss * weight).backward()
        if weight:
            totals.add(obj)
        if self.critic is not None:
            with self.critic.strategy.accumulate(last):
                values = self.critic.module.response_values(
                    batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
                cobj = critic_objective(values, batch, self.algo, self.cfg.critic.value_clip)
                (cobj.loss * weight).backward()
            if weight:
                totals.add(cobj, counted=False)

    def _update(self, count: float, loss_finite: bool = True) -> dict[str, float]:
        """One optimizer step of the policy (and critic) with gradients scaled by 1 / ``count``; a non-finite
        loss or gradient skips it, and ``actor.max_skipped_updates`` skips in a row stop the run."""
        if count <= 0:  # every group was dropped on every rank: nothing to learn from
            for m in self._trained():
                m.zero_grad()
            return {"actor/skipped_steps_count": 1.0, "actor/skipped_updates_count": 0.0}
        out = self.policy.apply_update(1.0 / count, loss_finite)
        skipped = out["skipped"]
        metrics = {"actor/grad_norm": out["grad_norm"], "actor/lr": out["lr"], "actor/skipped_steps_count": 0.0}
        if self.critic is not None:
            cout = self.critic.apply_update(1.0 / count, loss_finite)
            skipped = max(skipped, cout["skipped"])
            metrics.update({"critic/grad_norm": cout["grad_norm"], "critic/lr": cout["lr"]})
        metrics["actor/skipped_updates_count"] = skipped
        self.skipped_in_row = self.skipped_in_row + 1 if skipped else 0
        if self.skipped_in_row >= self.cfg.max_skipped_updates:
            raise RunHealthError(
                f"{self.skipped_in_row} optimizer steps in a row skipped for a non-finite loss or gradient "
                f"(actor.max_skipped_updates={self.cfg.max_skipped_updates}); the last: loss "
                f"{'finite' if loss_finite else 'not finite'}, gradient norm {out['grad_norm']}")
        return metrics

    @torch.no_grad()
    def _values(self, batch: RolloutBatch | None, dummy: RolloutBatch | None) -> torch.Tensor | None:
        """(B, Lr) values of the critic before this iteration's update, in micro-batches (None: no batch)."""
        assert self.critic is not None
        micro = batch.split(self.micro_batch_size) if batch is not None else []
        rounds = len(micro)
        if self.critic.strategy.lockstep:  # sharded forward passes are collectives: pad to the busiest rank
            rounds = int(all_reduce_max([len(micro)])[0])
        out = []
        for i in range(rounds):
            b = (micro[i] if i < len(micro) else _with_zero_advantages(dummy)).to(self.torch_device)
            values = self.critic.module.response_values(b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
            if i < len(micro):
                out.append(_pad_right(values.float().cpu(), batch.response_ids.shape[1]))  # type: ignore[union-attr]
        return torch.cat(out) if out else None

    # -- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> dict[str, int]:
        """Write weights, optimizer and schedule state and RNG state under ``path``: whole weights in HF
        format, or under a sharded strategy each rank's own shards (``actor/shards/``, nothing gathered).
        Returns the counters the driver keeps (the same on every rank), for ``counters`` at resume."""
        root = Path(path)
        if self.policy.sharded:
            self._save_sharded(root)
        else:
            self._save_whole(root)
        barrier()
        save_state(global_rng_state(), root / f"rng_actor{self.rank}.pt")
        return {"skipped_in_row": self.skipped_in_row}

    def _named(self) -> list[tuple[str, str, TrainedModel]]:
        return [("policy", ACTOR_DIR, self.policy)] + ([("critic", CRITIC_DIR, self.critic)] if self.critic else [])

    def _save_sharded(self, root: Path) -> None:
        saved = {name: model.save_sharded(root / folder / SHARDS) for name, folder, model in self._named()}
        if self.rank == 0:
            self.policy.module.config.save_pretrained(str(root / ACTOR_DIR))  # what the shards fill
            self.tokenizer.save_pretrained(str(root / ACTOR_DIR))
            save_state(saved, root / TRAINING_STATE)

    def _save_whole(self, root: Path) -> None:
        states = {}
        for name, model in (("policy", self.policy), ("critic", self.critic)):
            if model is not None:
                states[name] = (model.full_state_dict(), model.training_state())
        if self.rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            weights, policy_state = states["policy"]
            self.policy.module.save_pretrained(str(root / ACTOR_DIR), state_dict=weights)
            self.tokenizer.save_pretrained(str(root / ACTOR_DIR))
            saved: dict[str, Any] = {"policy": policy_state}
            if "critic" in states:
                weights, saved["critic"] = states["critic"]
                save_value_model(self.critic.module, weights, root / CRITIC_DIR)  # type: ignore[union-attr]
            save_state(saved, root / TRAINING_STATE)

    def _load_training_state(self, root: Path) -> None:
        saved = load_state(root / TRAINING_STATE)
        if is_sharded(root):
            if not self.policy.sharded:
                raise ValueError(f"{root / ACTOR_DIR / SHARDS}: a sharded checkpoint (actor.strategy=fsdp); "
                                 f"resume it with actor.strategy=fsdp, not {self.cfg.strategy}")
            for name, folder, model in self._named():
                model.load_sharded(root / folder / SHARDS, saved[name])
        else:
            self.policy.load_training_state(saved["policy"])
            if self.critic is not None:
                self.critic.load_training_state(saved["critic"])
        rng = root / f"rng_actor{self.rank}.pt"
        if rng.is_file():
            set_global_rng_state(load_state(rng))


def _losses_finite(metrics: dict[str, float]) -> bool:
    """Whether every loss among the (summed, so the same on every rank) step metrics is finite."""
    return all(math.isfinite(v) for k, v in metrics.items() if k.endswith("loss"))


def _split(batch: RolloutBatch | None, parts: int) -> list[RolloutBatch | None]:
    """``parts`` consecutive slices of the batch's rows (None entries when there are fewer rows)."""
    if batch is None or len(batch) == 0:
        return [None] * parts
    bounds = np.linspace(0, len(batch), parts + 1).round().astype(int)
    return [batch.select(range(lo, hi)) if hi > lo else None for lo, hi in zip(bounds[:-1], bounds[1:])]


def _pad_right(x: torch.Tensor, width: int) -> torch.Tensor:
    """(B, L) -> (B, width), zeros on the right (micro-batches are trimmed to their longest response)."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def _with_zero_advantages(batch: RolloutBatch | None) -> RolloutBatch:
    """A batch usable for a padding pass (its loss is multiplied by 0 anyway)."""
    if batch is None:
        raise RuntimeError("a lockstep padding pass needs at least one group on this rank")
    zeros = torch.zeros_like(batch.response_mask, dtype=torch.float32)
    batch.advantages = zeros if batch.advantages is None else batch.advantages
    batch.returns = zeros if batch.returns is None else batch.returns
    if batch.values is None:
        batch.values = zeros
    return batch
