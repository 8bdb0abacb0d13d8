"""The interface every embodied policy gives the workers: ``act`` and ``evaluate`` (and ``value``).

Rollout, actor and evaluation code call these three methods and nothing else, so a policy is
anything that implements them: the MLP / CNN actor-critics of ``policies.py``, the small VLA of
``vla.py``, or a larger model behind the same methods. The workers keep faster paths of their own
for the MLP actor-critic (numpy inference, closed-form gradients); those are optimisations of
exactly these methods, tested against them.

Log-probabilities come in one of two shapes. (B,): one per action (a Gaussian's density, a
categorical's choice). (B, K): one per token of an action emitted as K tokens (the VLA's action
tokens); PPO then takes a ratio per token with the action's advantage (token-level, as the
registered losses of ``m2flow.algorithms`` take them), and the action's log-probability is their sum.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch


class ActOutput(NamedTuple):
    actions: torch.Tensor
    """(B, *action_shape): sampled (or, when deterministic, most likely) actions."""
    logprobs: torch.Tensor
    """(B,) or (B, K): log-probability of the actions (or of each of their K tokens)."""
    values: torch.Tensor
    """(B,): critic estimate of each observation."""


class EvalOutput(NamedTuple):
    logprobs: torch.Tensor
    """(B,) or (B, K): log-probability of the given actions (or of each of their K tokens) under the current policy."""
    entropy: torch.Tensor
    """(B,): entropy of the action distribution (summed over independent dimensions or tokens)."""
    values: torch.Tensor
    """(B,): critic estimate of each observation."""


@runtime_checkable
class Policy(Protocol):
    """What rollout, actor and evaluation workers need from an embodied policy (an ``nn.Module``).

    Optional beyond these: ``critic_parameters()``, the parameters only the value depends on, which
    ``algorithm.critic_warmup`` trains alone (a policy without it cannot run a critic warm-up).
    """

    def act(
        self, obs: torch.Tensor, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> ActOutput:
        """(B, *obs_shape) -> actions, log-probs, values; no gradients; samples from ``generator`` when given."""
        ...

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> EvalOutput:
        """(B, *obs_shape), (B, *action_shape) -> log-probs, entropy, values; differentiable."""
        ...

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, *obs_shape) -> values (B,)."""
        ...
