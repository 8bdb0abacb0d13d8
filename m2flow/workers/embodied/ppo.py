"""The embodied PPO update: epochs of shuffled minibatches, data-parallel across actor ranks.

Every actor rank holds the whole batch and draws the same permutation, so minibatch j is the same
64 samples everywhere; rank r computes the loss of its share of them, scaled by 1 / 64, and the
gradients are summed with one all-reduce. The result equals a single process training on the full
minibatch (advantages are whitened over the full minibatch on every rank) up to float summation
order, so the number of ranks changes the speed, not the algorithm.

The per-minibatch cost on small policies is dispatch overhead, not arithmetic, so the step is kept
short: parameters and gradients live in two flat buffers (one all-reduce, one norm for clipping,
one fused Adam call), minibatches are slices of tensors permuted once per epoch, the advantage
whitening of every minibatch is computed in one vectorised pass per epoch, and metrics are summed
into one tensor read once per update.

The losses are those of :mod:`m2flow.algorithms.losses` (``ppo_policy_loss`` over all-valid samples
and the unclipped / clipped squared value error), written out for an unmasked batch; the tests check
one against the other. Deviation from that module, to match Stable-Baselines3 and CleanRL: the value
loss is the mean squared error without the 1/2, so ``vf_coef`` means what it means there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from m2flow.models.policies import ActorCritic, GaussianHead
from m2flow.workers.embodied.config import PPOConfig

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_METRICS = ("actor/pg_loss", "critic/value_loss", "actor/approx_kl", "actor/clip_frac")


class FlatParameters:
    """A module's trainable parameters and their gradients as views into two flat buffers.

    Autograd accumulates into an existing ``.grad`` in place, so gradients land in the flat buffer
    as long as nobody sets them to ``None``: use :meth:`zero_grad`, never ``module.zero_grad()``.
    """

    def __init__(self, module: nn.Module) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the module has no trainable parameters")
        total = sum(p.numel() for p in params)
        first = params[0]
        flat = torch.empty(total, dtype=first.dtype, device=first.device)
        grad = torch.zeros_like(flat)
        offset = 0
        for p in params:
            n = p.numel()
            flat[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = flat[offset : offset + n].view_as(p)
            p.grad = grad[offset : offset + n].view_as(p)
            offset += n
        self.params = params
        self.param = nn.Parameter(flat)  # shares the storage of flat: an update of it moves the module
        self.param.grad = grad

    @property
    def grad(self) -> Tensor:
        return self.param.grad  # type: ignore[return-value]

    def zero_grad(self) -> None:
        self.grad.zero_()

    def to(self, device: torch.device | str) -> None:
        """Move both buffers (context switching) and point the module's tensors at the moved ones."""
        device = torch.device(device)
        if self.param.device == device:
            return
        grad = self.grad.to(device)
        self.param.data = self.param.data.to(device)
        self.param.grad = grad
        offset = 0
        for p in self.params:
            n = p.numel()
            p.data = self.param.data[offset : offset + n].view_as(p)
            p.grad = grad[offset : offset + n].view_as(p)
            offset += n


@dataclass
class PPOBatch:
    """The flattened (B = T * N) samples of one iteration."""

    obs: Tensor
    """(B, *obs_shape)"""
    actions: Tensor
    """(B, *action_shape)"""
    logprobs: Tensor
    """(B,): log-probabilities under the policy that acted."""
    values: Tensor
    """(B,): value estimates of that policy."""
    advantages: Tensor
    """(B,)"""
    returns: Tensor
    """(B,): advantages + values, the value targets."""

    def __len__(self) -> int:
        return int(self.advantages.shape[0])


def evaluate_actions(policy: ActorCritic, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """(B, *obs_shape), (B, *action_shape) -> log-probs (B,), values (B,); differentiable.

    ``ActorCritic.evaluate`` without the entropy: the same numbers, fewer operations per call.
    """
    features = policy.actor_trunk(obs)
    critic = features if policy.critic_trunk is None else policy.critic_trunk(obs)
    head = policy.head
    if isinstance(head, GaussianHead):
        mean = head.mean(features)
        z = (actions - mean) * torch.exp(-head.log_std)
        logprobs = -0.5 * z.square().sum(-1) - (head.log_std.sum() + mean.shape[-1] * _LOG_SQRT_2PI)
    else:
        log_p = torch.log_softmax(head.logits(features), dim=-1)
        logprobs = log_p.gather(-1, actions.long().reshape(-1, 1)).squeeze(-1)
    return logprobs, policy.value_head(critic).squeeze(-1)


def whiten_minibatches(advantages: Tensor, bounds: list[tuple[int, int]], eps: float = 1e-8) -> Tensor:
    """(B,) permuted advantages whitened within each [start, end) minibatch (unbiased std, as torch)."""
    if not bounds:
        return advantages
    size = bounds[0][1] - bounds[0][0]
    full = len(bounds) if bounds[-1][1] - bounds[-1][0] == size else len(bounds) - 1
    out = torch.empty_like(advantages)
    if full:
        block = advantages[: full * size].view(full, size)
        std = block.std(dim=1, keepdim=True) if size > 1 else torch.zeros_like(block[:, :1])
        out[: full * size] = ((block - block.mean(dim=1, keepdim=True)) / (std + eps)).view(-1)
    for start, end in bounds[full:]:
        part = advantages[start:end]
        std = part.std() if end - start > 1 else torch.zeros((), dtype=part.dtype)
        out[start:end] = (part - part.mean()) / (std + eps)
    return out


class PPOUpdater:
    """Runs PPO epochs over a batch; with ``all_reduce`` set, as one rank of a data-parallel group."""

    def __init__(
        self,
        policy: ActorCritic,
        cfg: PPOConfig,
        rank: int = 0,
        world_size: int = 1,
        all_reduce: Callable[[Tensor], None] | None = None,
        seed: int = 0,
    ) -> None:
        if world_size > 1 and all_reduce is None:
            raise ValueError("a data-parallel update (world_size > 1) needs an all_reduce")
        self.policy = policy
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.all_reduce = all_reduce
        self.flat = FlatParameters(policy)
        self.optimizer = torch.optim.Adam([self.flat.param], lr=cfg.lr, eps=cfg.adam_eps, **_adam_kind())
        # The same seed on every rank: all ranks draw the same permutation of the batch.
        self.generator = torch.Generator().manual_seed(seed)

    def _minibatches(self, size: int) -> list[tuple[int, int]]:
        step = self.cfg.minibatch_size
        return [(s, min(s + step, size)) for s in range(0, size, step)]

    def _my_share(self, start: int, end: int) -> tuple[int, int]:
        """This rank's contiguous share of the minibatch [start, end)."""
        n = end - start
        lo = start + (n * self.rank) // self.world_size
        hi = start + (n * (self.rank + 1)) // self.world_size
        return lo, hi

    def update(self, batch: PPOBatch, lr: float | None = None) -> dict[str, float]:
        """``cfg.epochs`` passes of shuffled minibatches over ``batch``; metrics averaged over minibatches."""
        cfg = self.cfg
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        size = len(batch)
        bounds = self._minibatches(size)
        sums = torch.zeros(len(_METRICS))
        steps = 0
        stopped = False
        for _ in range(cfg.epochs):
            perm = torch.randperm(size, generator=self.generator)
            adv = batch.advantages[perm]
            if cfg.normalize_advantages and size > 1:
                adv = whiten_minibatches(adv, bounds)
            obs, actions = batch.obs[perm], batch.actions[perm]
            old_logp, old_values, returns = batch.logprobs[perm], batch.values[perm], batch.returns[perm]
            for start, end in bounds:
                lo, hi = self._my_share(start, end)
                loss, metrics = self._loss(
                    obs[lo:hi], actions[lo:hi], old_logp[lo:hi], adv[lo:hi],
                    returns[lo:hi], old_values[lo:hi], 1.0 / (end - start))
                if cfg.target_kl is not None and self._kl_exceeded(metrics[2]):
                    stopped = True
                    break
                self.flat.zero_grad()
                loss.backward()
                self._step()
                sums += metrics
                steps += 1
            if stopped:
                break
        if self.all_reduce is not None:
            self.all_reduce(sums)  # each rank summed its share of every minibatch
        out = {name: float(v) / max(steps, 1) for name, v in zip(_METRICS, sums.tolist())}
        out["actor/updates"] = float(steps)
        out["actor/early_stop"] = float(stopped)
        return out

    def _loss(self, obs: Tensor, actions: Tensor, old_logp: Tensor, adv: Tensor, returns: Tensor,
              old_values: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        """This rank's part of one minibatch's loss (sums times ``scale`` = 1 / minibatch size)."""
        cfg = self.cfg
        logp, values = evaluate_actions(self.policy, obs, actions)
        log_ratio = logp - old_logp
        ratio = torch.exp(log_ratio)
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)).sum() * scale
        loss = pg
        if cfg.use_critic:
            error = (values - returns).square()
            if cfg.value_clip is not None:
                clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
                error = torch.maximum(error, (clipped - returns).square())
            v_loss = error.sum() * scale
            loss = loss + cfg.vf_coef * v_loss
        else:
            v_loss = torch.zeros(())
        if cfg.ent_coef:
            _, entropy = self.policy.head.log_prob_entropy(self.policy.actor_trunk(obs), actions)
            loss = loss - cfg.ent_coef * entropy.sum() * scale
        with torch.no_grad():
            ratio_d, log_ratio_d = ratio.detach(), log_ratio.detach()
            metrics = torch.stack((
                pg.detach(), v_loss.detach(),
                ((ratio_d - 1.0) - log_ratio_d).sum() * scale,  # k3 estimate of KL(old || new)
                ((ratio_d - 1.0).abs() > cfg.clip).sum() * scale,
            ))
        return loss, metrics

    def _kl_exceeded(self, local_kl: Tensor) -> bool:
        kl = local_kl.clone()
        if self.all_reduce is not None:
            self.all_reduce(kl)
        return float(kl) > 1.5 * self.cfg.target_kl  # the threshold Stable-Baselines3 uses

    def _step(self) -> None:
        grad = self.flat.grad
        if self.all_reduce is not None:
            self.all_reduce(grad)
        if self.cfg.max_grad_norm > 0:
            norm = torch.linalg.vector_norm(grad)
            grad.mul_(torch.clamp(self.cfg.max_grad_norm / (norm + 1e-6), max=1.0))
        self.optimizer.step()

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


def _adam_kind() -> dict[str, bool]:
    """Fused Adam where this torch has it for CPU tensors (one kernel per step), else foreach."""
    try:
        probe = nn.Parameter(torch.zeros(1))
        probe.grad = torch.zeros(1)
        torch.optim.Adam([probe], fused=True).step()
        return {"fused": True}
    except (RuntimeError, TypeError):
        return {"foreach": True}
