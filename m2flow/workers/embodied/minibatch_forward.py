"""The policy's forward pass for the PPO inner loop, with as few tensor operations as possible.

On small policies a minibatch step costs what its operations cost to dispatch, not what they
compute, so this module computes exactly what ``ActorCritic.evaluate`` computes with fewer of
them: MLP trunks are called layer by layer (no module dispatch), constants of the log-probability
are folded into a per-sample offset computed once per update, and the log-ratio comes out of one
fused subtraction. Encoders other than the MLP go through their modules unchanged.

Any other policy (the VLA) goes through its ``evaluate`` (:class:`PolicyForward`), whose
log-probabilities may be per token, (B, K): the log-ratio then is (B, K) as well.

(Running the actor's and critic's layers as one batched matmul over stacked weights was tried:
on CPU it saved nothing measurable, so the two trunks stay separate.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from m2flow.models.policies import ActorCritic, GaussianHead, MLPEncoder
from m2flow.models.policy_types import Policy

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_ACTIVATIONS: dict[type[nn.Module], Callable[[Tensor], Tensor]] = {
    nn.Tanh: torch.tanh, nn.ReLU: torch.relu, nn.ELU: F.elu, nn.GELU: F.gelu, nn.SiLU: F.silu,
}


def direct_trunk(trunk: nn.Module) -> Callable[[Tensor], Tensor]:
    """A function equal to ``trunk(x)``: direct layer calls for an MLP encoder, else the module."""
    if not isinstance(trunk, MLPEncoder):
        return trunk
    steps: list[tuple[nn.Linear, Callable[[Tensor], Tensor]]] = []
    modules = [m for m in trunk.net if not isinstance(m, nn.Flatten)]
    for linear, act in zip(modules[0::2], modules[1::2]):
        if not isinstance(linear, nn.Linear) or type(act) not in _ACTIVATIONS:
            return trunk  # a layout this function does not know: use the module
        steps.append((linear, _ACTIVATIONS[type(act)]))

    def forward(x: Tensor) -> Tensor:
        if x.dim() > 2:
            x = x.flatten(1)
        for linear, act in steps:
            x = act(F.linear(x, linear.weight, linear.bias))
        return x

    return forward


class MinibatchForward:
    """``log pi(a|s) - log pi_old(a|s)`` and ``V(s)`` of an actor-critic, for minibatches."""

    def __init__(self, policy: ActorCritic) -> None:
        self.policy = policy
        self.actor = direct_trunk(policy.actor_trunk)
        self.critic = None if policy.critic_trunk is None else direct_trunk(policy.critic_trunk)
        self.gaussian = isinstance(policy.head, GaussianHead)

    def prepare_actions(self, actions: Tensor) -> Tensor:
        """Actions in the form :meth:`evaluate` takes: (B, A) floats, or (B, 1) int64 indices."""
        return actions if self.gaussian else actions.long().reshape(-1, 1)

    def offset(self, old_logprobs: Tensor) -> Tensor:
        """(B,) per-sample term folded into the log-ratio: minus the old log-prob and the constants."""
        if self.gaussian:
            dim = self.policy.head.mean.out_features
            return -(old_logprobs + dim * _LOG_SQRT_2PI)
        return -old_logprobs

    def evaluate(self, obs: Tensor, actions: Tensor, offset: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """(B, *obs_shape), prepared actions, (B,) offset -> log-ratio (B,), values (B,), log-softmax or None."""
        policy = self.policy
        head = policy.head
        features = self.actor(obs)
        critic = features if self.critic is None else self.critic(obs)
        values = F.linear(critic, policy.value_head.weight, policy.value_head.bias).squeeze(-1)
        if self.gaussian:
            mean = F.linear(features, head.mean.weight, head.mean.bias)
            z = (actions - mean) * torch.exp(-head.log_std)
            # log pi - log pi_old = -|z|^2 / 2 - sum(log std) - const - log pi_old
            log_ratio = torch.sub(offset - head.log_std.sum(), (z * z).sum(-1), alpha=0.5)
            return log_ratio, values, None
        log_p = torch.log_softmax(F.linear(features, head.logits.weight, head.logits.bias), dim=-1)
        return log_p.gather(-1, actions).squeeze(-1) + offset, values, log_p

    def entropy_sum(self, log_p: Tensor | None, n: int) -> Tensor:
        """The summed entropy of the n samples' action distributions (Gaussian: closed form)."""
        if self.gaussian:
            log_std = self.policy.head.log_std
            return n * (log_std.sum() + log_std.numel() * (0.5 + _LOG_SQRT_2PI))
        assert log_p is not None
        return -(log_p.exp() * log_p).sum()


class PolicyForward:
    """The same three calls for any :class:`Policy`, through its ``evaluate``; log-ratios (B,) or (B, K)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def prepare_actions(self, actions: Tensor) -> Tensor:
        return actions

    def offset(self, old_logprobs: Tensor) -> Tensor:
        """(B,) or (B, K): minus the old log-probs."""
        return -old_logprobs

    def evaluate(self, obs: Tensor, actions: Tensor, offset: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """-> log-ratio (B,) or (B, K), values (B,), entropies (B,)."""
        out = self.policy.evaluate(obs, actions)
        return out.logprobs + offset, out.values, out.entropy

    def entropy_sum(self, entropy: Tensor | None, n: int) -> Tensor:
        """The summed entropy of the n samples (``evaluate``'s third output)."""
        assert entropy is not None
        return entropy.sum()


def minibatch_forward(policy: Policy) -> MinibatchForward | PolicyForward:
    """The fast forward for an :class:`ActorCritic`, the ``evaluate``-based one for any other policy."""
    return MinibatchForward(policy) if isinstance(policy, ActorCritic) else PolicyForward(policy)
