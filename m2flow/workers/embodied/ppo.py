"""The embodied PPO update: epochs of shuffled minibatches, data-parallel across actor ranks.

Every actor rank holds the whole batch and draws the same permutation, so minibatch j is the same
64 samples everywhere; rank r computes the loss of its share of them, scaled by 1 / 64, and the
gradients are summed with one all-reduce. The result equals a single process training on the full
minibatch (advantages are whitened over the full minibatch on every rank) up to float summation
order, so the number of ranks changes the speed, not the algorithm.

The per-minibatch cost on small policies is dispatch overhead, not arithmetic, so the step is kept
short: MLP actor-critics get their gradient in closed form (``closed_form.py``; other policies use
autograd), and with ``compile`` the whole step is one compiled call (``compiled_step.py``);
parameters and gradients live in two flat buffers (``flat.py``: one all-reduce, one norm for
clipping, Adam as a handful of in-place operations); minibatches are slices of tensors permuted
once per epoch; the advantage whitening of every minibatch is computed in one vectorised pass per
epoch; metrics are summed into one tensor read once per update.

The loss is defined once, in :mod:`m2flow.algorithms.minibatch_ppo` (``ppo_policy_loss`` of
:mod:`m2flow.algorithms.losses` over all-valid samples and the unclipped / clipped squared value
error, for an unmasked batch; the tests check one against the other); the closed-form gradient is
tested against autograd of that definition. Deviation from ``losses.py``, to match Stable-Baselines3
and CleanRL: the value loss is the mean squared error without the 1/2, so ``vf_coef`` means what it
means there.

Stale samples (bounded staleness) carry ``PPOBatch.weights``, pi_prox / pi_behav: each sample's
surrogate is multiplied by its weight after the advantage whitening, which is the decoupled PPO
objective of ``m2flow.algorithms.offpolicy`` with ``logprobs`` the proximal policy's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from m2flow.algorithms.minibatch_ppo import MINIBATCH_PARTS, ppo_minibatch_loss
from m2flow.models.policies import ActorCritic, GaussianHead
from m2flow.models.policy_types import Policy
from m2flow.runtime.errors import RunHealthError
from m2flow.workers.embodied.closed_form import ClosedFormPPO, supports
from m2flow.workers.embodied.compiled_step import CompiledStep
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.flat import FlatAdam, FlatParameters
from m2flow.workers.embodied.minibatch_forward import PolicyForward, minibatch_forward

log = logging.getLogger(__name__)

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# What each minibatch adds up for the metrics: the loss's parts, then this rank's share of the samples.
_SUMS = (*MINIBATCH_PARTS, "count")


@dataclass
class PPOBatch:
    """The flattened (B = T * N) samples of one iteration."""

    obs: Tensor
    """(B, *obs_shape)"""
    actions: Tensor
    """(B, *action_shape)"""
    logprobs: Tensor
    """(B,), or (B, K) per token: log-probabilities under the policy that acted."""
    values: Tensor
    """(B,): value estimates of that policy."""
    advantages: Tensor
    """(B,)"""
    returns: Tensor
    """(B,): advantages + values, the value targets."""
    weights: Tensor | None = None
    """(B,) decoupled-PPO importance weights pi_prox / pi_behav of stale samples
    (``m2flow.algorithms.offpolicy``); None: every sample is on-policy (all weights 1)."""

    def __len__(self) -> int:
        return int(self.advantages.shape[0])


def evaluate_actions(policy: Policy, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """(B, *obs_shape), (B, *action_shape) -> log-probs (B,) or (B, K), values (B,); differentiable.

    For an actor-critic, ``ActorCritic.evaluate`` without the entropy: the same numbers, fewer
    operations per call; any other policy through its ``evaluate``.
    """
    if not isinstance(policy, ActorCritic):
        out = policy.evaluate(obs, actions)
        return out.logprobs, out.values
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
    """(B,) permuted advantages whitened within each [start, end) minibatch: (a - mean) / sqrt(var + eps).

    Unbiased variance, as torch; ``eps`` inside the square root and exact zeros for a minibatch of
    equal advantages (whose float mean may sit one rounding step off them), as ``masked_whiten``.
    """
    if not bounds:
        return advantages
    size = bounds[0][1] - bounds[0][0]
    full = len(bounds) if bounds[-1][1] - bounds[-1][0] == size else len(bounds) - 1
    out = torch.empty_like(advantages)
    if full:
        block = advantages[: full * size].view(full, size)  # [M, size]
        out[: full * size] = _whiten_rows(block, eps).view(-1)
    for start, end in bounds[full:]:
        out[start:end] = _whiten_rows(advantages[start:end].view(1, -1), eps).view(-1)
    return out


def _whiten_rows(block: Tensor, eps: float) -> Tensor:
    """[M, n] rows whitened each on its own; a constant row (a single sample included) gives zeros."""
    var = block.var(dim=1, keepdim=True) if block.shape[1] > 1 else torch.zeros_like(block[:, :1])
    out = (block - block.mean(dim=1, keepdim=True)) * torch.rsqrt(var + eps)
    constant = block.amax(dim=1, keepdim=True) == block.amin(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(out), out)


class PPOUpdater:
    """Runs PPO epochs over a batch; with ``all_reduce`` set, as one rank of a data-parallel group."""

    def __init__(
        self,
        policy: Policy,
        cfg: PPOConfig,
        rank: int = 0,
        world_size: int = 1,
        all_reduce: Callable[[Tensor], None] | None = None,
        seed: int = 0,
        closed_form: bool = True,
        compile: bool = False,
        max_skipped_updates: int = 3,
    ) -> None:
        if world_size > 1 and all_reduce is None:
            raise ValueError("a data-parallel update (world_size > 1) needs an all_reduce")
        self.policy = policy
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.all_reduce = all_reduce
        self.flat = FlatParameters(policy)
        self.policy_forward = minibatch_forward(policy)
        """The policy's forward for minibatches: log-ratio, values and entropy with few tensor operations."""
        self._entropy_seen: list = [torch.zeros(()), 0]  # summed entropy and samples of this update's forwards
        self.closed_form = (ClosedFormPPO(policy, cfg, self.flat.params) if closed_form and supports(policy, cfg)
                            else None)
        self._clip_coef = torch.zeros((), dtype=self.flat.param.dtype, device=self.flat.param.device)
        self.optimizer = FlatAdam(self.flat.param, lr=cfg.lr, eps=cfg.adam_eps)
        self.compiled: CompiledStep | None = None
        if compile and self.closed_form is None:
            log.warning("actor.compile: this policy or PPO config has no closed-form gradient (an MLP trunk with "
                        "tanh or relu, no value_clip); training eagerly")
        elif compile:
            fused = world_size == 1 and cfg.target_kl is None
            self.compiled = CompiledStep(self.closed_form.net, self.flat.layout, cfg.max_grad_norm,
                                         self.optimizer.betas, fused)
        # Adam's per-step scalars for the compiled step, as 0-dim tensors
        self._step_size = torch.zeros((), dtype=self.flat.param.dtype, device=self.flat.param.device)
        self._eps = torch.zeros_like(self._step_size)
        # The same seed on every rank: all ranks draw the same permutation of the batch.
        self.generator = torch.Generator().manual_seed(seed)
        self.max_skipped_updates = max_skipped_updates
        self.skipped_in_row = 0  # updates undone one after the other for a non-finite loss or weight
        self._grad_mask: Tensor | None = None  # set during a critic-only update: 1 on the critic's own parameters

    def _minibatches(self, size: int) -> list[tuple[int, int]]:
        step = self.cfg.minibatch_size
        return [(s, min(s + step, size)) for s in range(0, size, step)]

    def _my_share(self, start: int, end: int) -> tuple[int, int]:
        """This rank's contiguous share of the minibatch [start, end)."""
        n = end - start
        lo = start + (n * self.rank) // self.world_size
        hi = start + (n * (self.rank + 1)) // self.world_size
        return lo, hi

    def critic_mask(self) -> Tensor:
        """1 over the flat buffer's entries of the policy's ``critic_parameters()`` (those only the value
        depends on), 0 elsewhere."""
        get = getattr(self.policy, "critic_parameters", None)
        if get is None:
            raise ValueError(f"critic_warmup: {type(self.policy).__name__} does not say which parameters are the "
                             "critic's own (it has no critic_parameters())")
        where = {id(p): (o, n) for p, (o, n, _) in zip(self.flat.params, self.flat.layout)}
        mask = torch.zeros_like(self.flat.param.data)
        for p in get():
            o, n = where[id(p)]
            mask[o : o + n] = 1.0
        return mask

    def update(self, batch: PPOBatch, lr: float | None = None, critic_only: bool = False) -> dict[str, float]:
        """``cfg.epochs`` passes of shuffled minibatches over ``batch``; metrics averaged over minibatches.

        ``critic_only``: the value loss alone, with gradients to the critic's own parameters only (a
        critic warm-up); the policy's outputs do not change.
        """
        if critic_only:  # the mask alone keeps the policy as it is: its gradient never reaches a critic parameter
            self._grad_mask = self.critic_mask()
            try:
                return {**self._update(batch, lr, eager=True), "actor/critic_warmup": 1.0}
            finally:
                self._grad_mask = None
        return {**self._update(batch, lr, eager=False), "actor/critic_warmup": 0.0}

    def _update(self, batch: PPOBatch, lr: float | None, eager: bool) -> dict[str, float]:
        cfg = self.cfg
        if lr is not None:
            self.optimizer.lr = lr
        size = len(batch)
        bounds = self._minibatches(size)
        forward = self.policy_forward
        # Per-sample columns gathered together once per epoch: offset, old value, return, advantage.
        offsets = forward.offset(batch.logprobs)  # (B,), or (B, K) with a log-prob per token
        per_token = offsets.dim() == 2  # then the offsets are gathered on their own
        columns = torch.stack((batch.values, batch.returns, batch.advantages) if per_token
                              else (offsets, batch.values, batch.returns, batch.advantages))
        actions = forward.prepare_actions(batch.actions)
        # Each minibatch's loss is a mean: the scale 1 / size is folded into the advantages.
        neg_scale = torch.empty(size, dtype=batch.advantages.dtype, device=batch.advantages.device)
        for start, end in bounds:
            neg_scale[start:end] = -1.0 / (end - start)
        sums = torch.zeros(len(_SUMS), dtype=batch.advantages.dtype, device=batch.advantages.device)
        self._entropy_seen = [torch.zeros((), dtype=sums.dtype, device=sums.device), 0]
        weights: dict[int, Tensor] = {}
        count = 0.0  # sum over minibatches of this rank's share of it
        steps = 0
        saved = self._snapshot()  # a non-finite loss anywhere in the update undoes all of it
        stopped = False
        for _ in range(cfg.epochs):
            perm = torch.randperm(size, generator=self.generator).to(batch.advantages.device)
            if per_token:
                old_values, returns, adv = columns[:, perm].unbind(0)
                offset = offsets[perm]
            else:
                offset, old_values, returns, adv = columns[:, perm].unbind(0)
            if cfg.normalize_advantages and size > 1:
                adv = whiten_minibatches(adv.contiguous(), bounds)
            neg_adv = adv * neg_scale
            if batch.weights is not None:  # decoupled PPO: the surrogate of each sample times its weight
                neg_adv = neg_adv * batch.weights[perm]
            obs, act = batch.obs[perm], actions[perm]
            for start, end in bounds:
                lo, hi = self._my_share(start, end)
                n = end - start
                share = (obs[lo:hi], act[lo:hi], offset[lo:hi], neg_adv[lo:hi], returns[lo:hi])
                done = self._compiled_minibatch(share, n) if self.compiling and not eager else None
                parts, stopped = done if done is not None else self._eager_minibatch(share, old_values[lo:hi], n)
                if stopped:
                    break
                w = weights.get(n)
                if w is None:  # the policy loss comes scaled already; the other sums are scaled here
                    w = weights[n] = torch.tensor([1.0] + [1.0 / n] * (len(_SUMS) - 2), dtype=sums.dtype,
                                                  device=sums.device)
                sums[:-1].addcmul_(parts, w)
                count += (hi - lo) / n
                steps += 1
            if stopped:
                break
        sums[-1] = count
        if self.all_reduce is not None:
            self.all_reduce(sums)  # each rank summed its share of every minibatch
        values = sums.tolist()
        # Summed over ranks and applied to identical weights, so every rank decides alike.
        skipped = not (all(map(math.isfinite, values)) and bool(torch.isfinite(self.flat.param).all()))
        if skipped:
            self._restore(saved)
        self._count_skip(skipped)
        pg, sq, ratio, log_ratio, clipped, count = (float(v) / max(steps, 1) for v in values)
        entropy_sum, entropy_samples = self._entropy_seen
        entropy = {"actor/entropy": float(entropy_sum) / entropy_samples} if entropy_samples else {}
        return {
            **entropy,
            "actor/skipped_updates_count": float(skipped),
            "actor/pg_loss": pg,
            "critic/value_loss": sq,
            "actor/approx_kl": ratio - count - log_ratio,  # the mean of (ratio - 1) - log ratio
            "actor/clip_frac": clipped,
            "actor/updates": float(steps),
            "actor/early_stop": float(stopped),
        }

    def _snapshot(self) -> tuple[Tensor, Tensor, Tensor, int]:
        """Copies of the weights and Adam's state (flat buffers: three copies of the parameter count)."""
        opt = self.optimizer
        return self.flat.param.detach().clone(), opt.exp_avg.clone(), opt.exp_avg_sq.clone(), opt.step_count

    def _restore(self, saved: tuple[Tensor, Tensor, Tensor, int]) -> None:
        param, exp_avg, exp_avg_sq, step_count = saved
        with torch.no_grad():
            self.flat.param.copy_(param)
        self.optimizer.exp_avg.copy_(exp_avg)
        self.optimizer.exp_avg_sq.copy_(exp_avg_sq)
        self.optimizer.step_count = step_count
        log.warning("a PPO update gave a non-finite loss or weight: undone (skipped), weights and optimizer state "
                    "restored")

    def _count_skip(self, skipped: bool) -> None:
        """Count skips in a row; ``max_skipped_updates`` of them stop the run."""
        self.skipped_in_row = self.skipped_in_row + 1 if skipped else 0
        if self.skipped_in_row >= self.max_skipped_updates:
            raise RunHealthError(f"{self.skipped_in_row} PPO updates in a row skipped for a non-finite loss or "
                                 f"weight (actor.max_skipped_updates={self.max_skipped_updates})")

    @property
    def compiling(self) -> bool:
        """Whether minibatch steps run compiled (``compile=True``, a supported policy, no compile failure)."""
        return self.compiled is not None and self.compiled.active

    def _eager_minibatch(self, share: tuple[Tensor, ...], old_values: Tensor, n: int) -> tuple[Tensor, bool]:
        """One minibatch share, gradient and step: (metric parts, whether ``target_kl`` stopped the epochs)."""
        if self.closed_form is not None:  # gradients written directly
            parts = self.closed_form.step(*share, 1.0 / n)
        else:
            loss, parts = self._step_loss(*share, old_values, 1.0 / n)
        if self.cfg.target_kl is not None and self._kl_exceeded(parts, share[0].shape[0], 1.0 / n):
            return parts, True
        if self.closed_form is None:
            self.flat.zero_grad()
            loss.backward()
        self._step()
        return parts, False

    def _compiled_minibatch(self, share: tuple[Tensor, ...], n: int) -> tuple[Tensor, bool] | None:
        """``_eager_minibatch`` through the compiled step; None if compiling failed (nothing was changed)."""
        compiled, closed, opt = self.compiled, self.closed_form, self.optimizer
        assert compiled is not None and closed is not None
        step_size, eps = opt.scalars(opt.step_count + 1)
        self._step_size.fill_(step_size)
        self._eps.fill_(eps)
        args = (closed.k, *share, *closed.scalars(share[0].shape[0], 1.0 / n))
        flat, state = self.flat.param.data, (opt.exp_avg, opt.exp_avg_sq, self._step_size, self._eps)
        if compiled.fused:
            parts = compiled.whole(flat, *state, *args)
            if parts is None:
                return None
        else:
            out = compiled.gradient(flat, *args)
            if out is None:
                return None
            grad, parts = out
            if self.cfg.target_kl is not None and self._kl_exceeded(parts, share[0].shape[0], 1.0 / n):
                return parts, True
            self.flat.grad.copy_(grad)
            if self.all_reduce is not None:
                self.all_reduce(self.flat.grad)
            if not compiled.update(flat, self.flat.grad, *state):
                self._step(reduce=False)  # the summed gradient is there: finish this step eagerly
                return parts, False
        opt.step_count += 1
        return parts, False

    def warm_up(self, batch: PPOBatch) -> None:
        """Compile the minibatch step for ``batch``'s shapes now, on copies of the state.

        Run by the actor worker before training, on a batch of zeros of the right shapes, so the
        compile is start-up cost rather than part of the first update. Nothing is summed across
        ranks and nothing the update uses (weights, Adam, the shuffling generator) changes.
        """
        compiled, closed = self.compiled, self.closed_form
        if compiled is None or closed is None:
            return
        opt = self.optimizer
        actions = self.policy_forward.prepare_actions(batch.actions)
        offset = self.policy_forward.offset(batch.logprobs)
        shapes = {(hi - lo, end - start): (lo, hi) for start, end in self._minibatches(len(batch))
                  for lo, hi in [self._my_share(start, end)]}
        for (m, n), (lo, hi) in shapes.items():
            share = (batch.obs[lo:hi], actions[lo:hi], offset[lo:hi], batch.advantages[lo:hi], batch.returns[lo:hi])
            args = (closed.k, *share, *closed.scalars(m, 1.0 / n))
            flat = self.flat.param.data.clone()
            state = (opt.exp_avg.clone(), opt.exp_avg_sq.clone(), self._step_size, self._eps)
            if compiled.fused:
                compiled.whole(flat, *state, *args)
            elif (out := compiled.gradient(flat, *args)) is not None:
                compiled.update(flat, out[0], *state)
            if not compiled.active:
                return

    def _step_loss(self, obs: Tensor, actions: Tensor, offset: Tensor, neg_adv: Tensor, returns: Tensor,
                   old_values: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        """This rank's part of one minibatch's loss, and its summed parts for the metrics.

        ``neg_adv`` is minus the advantage times ``scale`` (1 / minibatch size); the loss and its
        parts are ``m2flow.algorithms.minibatch_ppo.ppo_minibatch_loss``'s. With a log-prob per token
        ((B, K) log-ratios) every token is a sample of the clipped surrogate with its action's advantage
        and weight 1 / K, the token-mean of ``losses.ppo_policy_loss`` over the (B, K) tokens; the
        ratio parts are then means over each action's tokens.
        """
        cfg = self.cfg
        log_ratio, values, log_p = self.policy_forward.evaluate(obs, actions, offset)
        entropy = self.policy_forward.entropy_sum(log_p, obs.shape[0]) if cfg.ent_coef else None
        if isinstance(self.policy_forward, PolicyForward) and log_p is not None:
            # Any policy's ``evaluate`` gives each sample's entropy with its log-probs: the update's
            # ``actor/entropy`` comes from here, with no forward pass of its own.
            self._entropy_seen[0] += log_p.detach().sum()
            self._entropy_seen[1] += log_p.shape[0]
        per_token = log_ratio.dim() == 2
        k = log_ratio.shape[1] if per_token else 1
        if per_token:  # [B, K] -> [B * K]
            neg_adv = (neg_adv / k).unsqueeze(1).expand(-1, k).reshape(-1)
            log_ratio = log_ratio.reshape(-1)
        loss, parts = ppo_minibatch_loss(log_ratio, neg_adv, values if cfg.use_critic else None, returns,
                                         clip=cfg.clip, scale=scale, vf_coef=cfg.vf_coef, old_values=old_values,
                                         value_clip=cfg.value_clip, ent_coef=cfg.ent_coef, entropy_sum=entropy)
        if per_token:
            parts = torch.cat((parts[:2], parts[2:] / k))
        return loss, parts

    def minibatch_loss(self, obs: Tensor, actions: Tensor, old_logprobs: Tensor, advantages: Tensor,
                       returns: Tensor, old_values: Tensor,
                       weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of one whole minibatch (advantages as given, times ``weights`` when set) and its
        metrics; for checks and tools."""
        n = advantages.shape[0]
        forward = self.policy_forward
        neg_adv = -advantages / n if weights is None else -advantages * weights / n
        loss, parts = self._step_loss(obs, forward.prepare_actions(actions), forward.offset(old_logprobs),
                                      neg_adv, returns, old_values, 1.0 / n)
        return loss, {
            "actor/pg_loss": parts[0],
            "critic/value_loss": parts[1] / n,
            "actor/approx_kl": (parts[2] - n - parts[3]) / n,
            "actor/clip_frac": parts[4] / n,
        }

    def to(self, device: torch.device | str) -> None:
        """Move parameters, gradients and optimizer state (context switching)."""
        self.flat.to(device)
        self.optimizer.to(device)
        if self.closed_form is not None:
            self.closed_form.to(device)
        self._clip_coef = self._clip_coef.to(device)

    def _kl_exceeded(self, parts: Tensor, n: int, scale: float) -> bool:
        """Whether the minibatch's approx KL (over all ranks) passes 1.5 x target_kl, SB3's threshold."""
        kl = ((parts[2] - n - parts[3]) * scale).detach().reshape(1).clone()
        if self.all_reduce is not None:
            self.all_reduce(kl)
        return float(kl) > 1.5 * self.cfg.target_kl

    def _step(self, reduce: bool = True) -> None:
        grad = self.flat.grad
        if reduce and self.all_reduce is not None:
            self.all_reduce(grad)
        if self._grad_mask is not None:
            grad.mul_(self._grad_mask)
        if self.cfg.max_grad_norm > 0:
            norm = torch.linalg.vector_norm(grad)
            if grad.is_cuda:  # no host sync per step on a GPU
                grad.mul_(torch.clamp(self.cfg.max_grad_norm / (norm + 1e-6), max=1.0))
            else:
                coef = self.cfg.max_grad_norm / (float(norm) + 1e-6)  # as clip_grad_norm_
                if coef < 1.0:
                    grad.mul_(self._clip_coef.fill_(coef))
        self.optimizer.step()

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
