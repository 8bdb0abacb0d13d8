"""``ActorWorker``: PPO updates of the actor-critic, data-parallel over its ranks.

Per iteration (``train``): receive every env rank's trajectory (each actor rank gets all of them),
evaluate the old log-probabilities and values of the whole batch in one pass (the weights are
those the rollout acted with: weights are synced only after an update), compute GAE with
truncation bootstrapping (``m2flow.algorithms``), and run the PPO epochs (``ppo.PPOUpdater``),
with gradients summed across ranks by torch.distributed (gloo on CPU, NCCL on GPU).

With ``max_staleness`` s > 0 the trajectories of iteration k may have been collected with older
weights (``Trajectory.policy_version`` < k, the actor's version being the iterations it has
trained on). Every rank keeps a copy of the weights of each version it sent within the bound;
a trajectory older than s is dropped and counted, never trained on, and for the others the old
log-probs are the current (proximal) weights' and each sample is weighted by pi_prox / pi_behav
(decoupled PPO, ``m2flow.algorithms.offpolicy``), pi_behav scored with the copy that acted.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from m2flow.algorithms.offpolicy import StalenessSplit, split_by_staleness, staleness_metrics
from m2flow.models.policies import ActorCritic, GaussianHead, build_policy
from m2flow.models.policy_types import Policy
from m2flow.runtime.comm.collectives import ExchangeSum
from m2flow.runtime.trace import get_tracer, trace_category
from m2flow.runtime.worker import Worker
from m2flow.workers.config import uses_exchange
from m2flow.workers.embodied.batch import build_batch
from m2flow.workers.embodied.messages import Trajectory
from m2flow.workers.embodied.ppo import PPOBatch, PPOUpdater
from m2flow.workers.embodied.settings import EmbodiedActorSettings
from m2flow.workers.state_file import load_state, save_state

log = logging.getLogger(__name__)

ACTOR_FILE = "actor.pt"
_ENTROPY_SAMPLE = 256  # samples the entropy metric of a policy other than the actor-critic is measured on


def zero_batch(obs_space: Any, action_space: Any, size: int, device: torch.device) -> PPOBatch:
    """A batch of ``size`` zero samples with the shapes and dtypes ``build_batch`` gives (for compiling)."""
    discrete = not getattr(action_space, "shape", None)
    actions = (torch.zeros(size, dtype=torch.int64, device=device) if discrete
               else torch.zeros((size, *action_space.shape), device=device))
    column = torch.zeros(size, device=device)
    return PPOBatch(torch.zeros((size, *obs_space.shape), device=device), actions, column, column, column, column)


def _all_reduce_sum(tensor: torch.Tensor) -> None:
    import torch.distributed as dist

    dist.all_reduce(tensor)


class ActorWorker(Worker):
    """Trains the policy on each iteration's trajectories; rank 0 sends weights and checkpoints."""

    def __init__(self, *, settings: EmbodiedActorSettings) -> None:
        s = settings
        obs_space, action_space, actor, ppo, seed = s.obs_space, s.action_space, s.actor, s.ppo, s.seed
        self.cfg = ppo
        self.max_staleness = s.max_staleness
        # version -> the weights sent at that version, kept while samples of it may still arrive
        self._sent: dict[int, dict[str, torch.Tensor]] = {}
        self._scratch: list[Policy] = []  # copies of the policy to score samples of older versions
        self.env_group = s.env_group
        self.env_ranks = s.env_ranks
        self.total_iterations = s.total_iterations
        self.shares_devices = s.shares_devices
        self.offload_after = s.offload and s.shares_devices
        self.device = self.torch_device
        torch.manual_seed(seed)  # the same initial weights on every rank
        self.policy = build_policy(obs_space, action_space, s.policy).to(self.device)
        all_reduce = None
        if self.world_size > 1:
            backend = None if actor.backend == "auto" else actor.backend
            self.init_process_group(backend)
            exchange = uses_exchange(actor.host_sum, self.world_size, self.device.type)
            all_reduce = ExchangeSum(self.comm, self.group_name, self.rank, self.world_size) if exchange else _all_reduce_sum
        self.updater = PPOUpdater(self.policy, ppo, self.rank, self.world_size, all_reduce, seed=seed,
                                  compile=actor.compile, max_skipped_updates=actor.max_skipped_updates)
        if ppo.critic_warmup:
            self.updater.critic_mask()  # a policy that cannot name its critic's parameters fails now, not later
        if actor.compile and s.batch_size:  # compile now: start-up cost, not part of the first update
            self.updater.warm_up(zero_batch(obs_space, action_space, s.batch_size, self.device))
        self._host_state: dict[str, torch.Tensor] | None = None

    # -- the iteration ---------------------------------------------------------------------------
    @trace_category("train")
    def train(self, iteration: int) -> dict[str, float]:
        """One PPO update on the trajectories of every env rank for ``iteration``."""
        t0 = time.perf_counter()
        # Waiting for the env ranks is a span of its own, so the trace does not count it as training.
        with get_tracer().span("wait_trajectories", cat="wait_channel", iteration=iteration):
            trajs = [self.comm.recv(self.env_group, e) for e in range(self.env_ranks)]
        for traj in trajs:
            if traj.iteration != iteration:
                raise RuntimeError(f"expected trajectories of iteration {iteration}, env rank "
                                   f"{traj.env_rank} sent iteration {traj.iteration}")
        t1 = time.perf_counter()
        kept, split = self._fresh(trajs, iteration)
        t2 = t1
        if not kept:  # every sample was too old: no update this iteration
            metrics = {"actor/updates": 0.0, "actor/batch_size": 0.0}
        elif self.shares_devices:
            with self.device_turn(offload_after=self.offload_after):
                t2 = time.perf_counter()  # the device is ours from here
                metrics = self._train(kept, iteration)
        else:
            metrics = self._train(kept, iteration)
        if self.max_staleness > 0:
            metrics.update(staleness_metrics(split.by_age, split.dropped))
        metrics["time/actor_wait_s"] = t1 - t0
        metrics["time/actor_lock_wait_s"] = t2 - t1  # waiting for a turn on shared devices
        metrics["time/actor_busy_s"] = time.perf_counter() - t2
        return metrics

    def _fresh(self, trajs: list[Trajectory], iteration: int) -> tuple[list[Trajectory], StalenessSplit]:
        """The trajectories within the staleness bound (the others are dropped), and the split by age."""
        try:
            split = split_by_staleness(iteration, [t.policy_version for t in trajs],
                                       [t.num_steps * t.num_envs for t in trajs], self.max_staleness)
        except ValueError as e:
            raise RuntimeError(f"actor at iteration {iteration}, trajectories by env rank: {e}") from None
        for version in [v for v in self._sent if v < iteration - self.max_staleness]:
            del self._sent[version]  # no sample of it can be trained on any more
        return [t for t, ok in zip(trajs, split.fresh) if ok], split

    def _behaviour_policies(self, trajs: list[Trajectory], iteration: int) -> list[Policy | np.ndarray | None] | None:
        """Per trajectory collected by weights other than the current ones, its behaviour log-probs: those the
        rollout recorded as it acted, else the policy that acted (a copy of those weights, to score them);
        None where the current weights acted."""
        if all(t.policy_version == iteration for t in trajs):
            return None
        stale = sorted({t.policy_version for t in trajs
                        if t.policy_version != iteration and t.behaviour_logprobs is None})
        while len(self._scratch) < len(stale):  # one scratch copy per version in use, reused
            self._scratch.append(copy.deepcopy(self.policy))
        loaded: dict[int, Policy] = {}
        for v, policy in zip(stale, self._scratch):
            if v not in self._sent:
                raise RuntimeError(f"iteration {iteration}: trajectories were collected with weights of "
                                   f"version {v}, which this actor never sent")
            policy.load_state_dict(self._sent[v])
            loaded[v] = policy
        return [None if t.policy_version == iteration
                else t.behaviour_logprobs if t.behaviour_logprobs is not None else loaded[t.policy_version]
                for t in trajs]

    def _train(self, trajs: list[Trajectory], iteration: int) -> dict[str, float]:
        behaviour = self._behaviour_policies(trajs, iteration) if self.max_staleness > 0 else None
        batch, extra = build_batch(self.policy, trajs, self.cfg, self.device, behaviour)
        lr = self.cfg.lr
        if self.cfg.lr_schedule == "linear":
            lr *= 1.0 - iteration / max(self.total_iterations, 1)
        warmup = iteration < self.cfg.critic_warmup
        if warmup and self.cfg.critic_warmup_lr is not None:
            lr = self.cfg.critic_warmup_lr
        metrics = self.updater.update(batch, lr, critic_only=warmup)
        metrics.update(extra)
        metrics["actor/lr"] = lr
        if self.updater.compiled is not None:
            metrics["actor/compiled"] = float(self.updater.compiling)  # 0 once a compile failure fell back
        metrics.update(self._policy_stats(batch, metrics))
        return metrics

    def _policy_stats(self, batch: PPOBatch, update: dict[str, float]) -> dict[str, float]:
        if not isinstance(self.policy, ActorCritic):
            if "actor/entropy" in update:  # the mean over the update's minibatch forwards, no pass of its own
                return {}
            with torch.no_grad():  # an update that ran no forward (a critic warm-up): a sample of the batch
                out = self.policy.evaluate(batch.obs[:_ENTROPY_SAMPLE], batch.actions[:_ENTROPY_SAMPLE])
            return {"actor/entropy": float(out.entropy.mean())}
        head = self.policy.head
        with torch.no_grad():
            if isinstance(head, GaussianHead):
                entropy = float((head.log_std + 0.5 + 0.5 * np.log(2 * np.pi)).sum())
                return {"actor/entropy": entropy, "actor/action_std": float(head.log_std.exp().mean())}
            sample = batch.obs[:4096]
            _, ent = head.log_prob_entropy(self.policy.actor_trunk(sample), batch.actions[:4096])
            return {"actor/entropy": float(ent.mean())}

    # -- weights ---------------------------------------------------------------------------------
    @trace_category("weight_sync")
    def send_weights(self, targets: list[tuple[str, list[int]]], version: int | None = None) -> None:
        """Rank 0 streams the current weights to each (group, ranks) target; other ranks do nothing.

        With staleness allowed, every rank keeps a copy of the weights as of ``version`` (the
        iterations trained so far) to score the samples they will collect."""
        from m2flow.runtime.comm.weights import send_weights

        if self.max_staleness > 0 and version is not None:
            self._sent[version] = self.state_dict()
        if self.rank != 0:
            return
        for group, ranks in targets:
            send_weights(self.comm, self.policy, group, ranks)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy weights, on the CPU."""
        return {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}

    # -- context switching -----------------------------------------------------------------------
    def offload(self) -> None:
        if self.device.type == "cpu":
            return  # nothing to free: host memory is where it would go
        self.updater.to("cpu")  # not policy.to(): that would cut the views into the flat buffers

    def onload(self) -> None:
        if self.device.type == "cpu":
            return
        self.updater.to(self.device)

    # -- checkpoint ------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> dict[str, int]:
        """Rank 0 writes weights, optimizer state and the shuffling generator (all ranks agree); every rank
        returns the counters the driver keeps in ``trainer_state.json`` (the same on every rank)."""
        if self.rank == 0:
            path = Path(directory) / ACTOR_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            save_state({"policy": self.state_dict(), "updater": self.updater.state_dict()}, path)
        return {"skipped_in_row": self.updater.skipped_in_row}

    def load_checkpoint(self, directory: str, counters: dict[str, int] | None = None) -> None:
        """Restore what ``save_checkpoint`` wrote, and the ``counters`` it returned."""
        state = load_state(Path(directory) / ACTOR_FILE, map_location=self.device)
        with torch.no_grad():
            for name, tensor in self.policy.state_dict().items():
                tensor.copy_(state["policy"][name])  # in place: the flat buffers stay shared
        self.updater.load_state_dict(state["updater"])
        self.updater.skipped_in_row = int((counters or {}).get("skipped_in_row", 0))
