"""Embodied policies built from the env's spaces: the actor-critics, and the factory of every kind.

``build_policy(obs_space, action_space, config)`` builds the ``Policy`` (``policy_types.py``) that
``config.kind`` names (``actor_critic`` here, ``vla`` in ``vla.py``) and loads ``config.init_from``
into it. ``build_actor_critic`` picks an encoder (MLP for vectors, CNN for
images) and an action head (diagonal Gaussian for ``Box`` actions, categorical for ``Discrete``).
The defaults are Stable-Baselines3's PPO ``MlpPolicy``: separate actor and critic MLPs of (64, 64)
tanh units, a state-independent log-std starting at 0, no tanh squashing (the env clips actions),
and orthogonal init with gains sqrt(2) (hidden), 0.01 (action) and 1 (value), biases zero.

Log-probabilities and entropies are computed in closed form rather than through
``torch.distributions`` objects: the same numbers without the per-call construction cost, which
matters for batch-8 inference on every env step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from m2flow.models.cnn import CNNEncoder
from m2flow.models.policy_config import ACTIVATION_CLASSES, ENCODERS, PolicyConfig
from m2flow.models.policy_types import ActOutput, EvalOutput, Policy

__all__ = ["ActOutput", "ActorCritic", "EvalOutput", "Policy", "PolicyConfig", "build_actor_critic", "build_policy"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)

ACTIVATIONS: dict[str, type[nn.Module]] = {name: getattr(nn, cls) for name, cls in ACTIVATION_CLASSES.items()}


# ---------------------------------------------------------------------------------------- encoders

Encoder = Callable[[gym.spaces.Box, PolicyConfig], nn.Module]
"""Builds a module (B, *obs_shape) -> (B, out_dim) with an ``out_dim`` attribute."""


def register_encoder(name: str) -> Callable[[Encoder], Encoder]:
    """Decorator registering an observation encoder; a duplicate name raises."""
    return ENCODERS.register(name)


class MLPEncoder(nn.Module):
    """Observations (B, *obs_shape) -> hidden features (B, hidden_sizes[-1]) through an MLP."""

    def __init__(self, in_dim: int, hidden_sizes: list[int], activation: type[nn.Module]) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        for size in hidden_sizes:
            layers += [nn.Linear(in_dim, size), activation()]
            in_dim = size
        self.net = nn.Sequential(*layers)
        self.out_dim = in_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


@register_encoder("mlp")
def _mlp_encoder(space: gym.spaces.Box, config: PolicyConfig) -> nn.Module:
    return MLPEncoder(int(np.prod(space.shape)), config.hidden_sizes, ACTIVATIONS[config.activation])


@register_encoder("cnn")
def _cnn_encoder(space: gym.spaces.Box, config: PolicyConfig) -> nn.Module:
    activation = ACTIVATIONS[config.activation]
    cnn = CNNEncoder(
        tuple(space.shape),
        config.cnn_channels,
        config.cnn_kernels,
        config.cnn_strides,
        config.cnn_features,
        scale=1.0 / 255.0 if space.dtype == np.uint8 else 1.0,
    )
    # The MLP layers after the convolutions keep hidden_sizes meaning the same thing for every encoder.
    mlp = MLPEncoder(cnn.out_dim, config.hidden_sizes, activation)
    encoder = nn.Sequential(cnn, mlp)
    encoder.out_dim = mlp.out_dim
    return encoder


# ------------------------------------------------------------------------------------ action heads


class GaussianHead(nn.Module):
    """Diagonal Gaussian with a state-independent log-std; features (B, F) -> actions (B, A)."""

    def __init__(self, in_dim: int, action_dim: int, log_std_init: float) -> None:
        super().__init__()
        self.mean = nn.Linear(in_dim, action_dim)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def sample(
        self, features: torch.Tensor, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, F) -> actions (B, A), their log-probs (B,)."""
        mean = self.mean(features)
        if deterministic:
            actions = mean
        else:
            noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
            actions = mean + self.log_std.exp() * noise
        return actions, self._log_prob(mean, actions)

    def log_prob_entropy(
        self, features: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, F), (B, A) -> log-probs (B,), entropy (B,)."""
        mean = self.mean(features)
        entropy = (self.log_std + 0.5 + _LOG_SQRT_2PI).sum().expand(mean.shape[0])
        return self._log_prob(mean, actions), entropy

    def _log_prob(self, mean: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - mean) * torch.exp(-self.log_std)
        return (-0.5 * z.square() - self.log_std - _LOG_SQRT_2PI).sum(dim=-1)

    def distribution(self, features: torch.Tensor) -> torch.distributions.Distribution:
        """The action distribution as a torch object, for KL terms and checks."""
        mean = self.mean(features)
        normal = torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))
        return torch.distributions.Independent(normal, 1)


class CategoricalHead(nn.Module):
    """Categorical over ``n`` actions; features (B, F) -> actions (B,) int64."""

    def __init__(self, in_dim: int, n: int) -> None:
        super().__init__()
        self.logits = nn.Linear(in_dim, n)

    def sample(
        self, features: torch.Tensor, deterministic: bool, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, F) -> actions (B,), their log-probs (B,)."""
        log_p = torch.log_softmax(self.logits(features), dim=-1)
        if deterministic:
            actions = log_p.argmax(dim=-1)
        else:
            actions = torch.multinomial(log_p.exp(), 1, generator=generator).squeeze(-1)
        return actions, log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def log_prob_entropy(
        self, features: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, F), (B,) -> log-probs (B,), entropy (B,)."""
        log_p = torch.log_softmax(self.logits(features), dim=-1)
        logprob = log_p.gather(-1, actions.long().reshape(-1, 1)).squeeze(-1)
        return logprob, -(log_p.exp() * log_p).sum(dim=-1)

    def distribution(self, features: torch.Tensor) -> torch.distributions.Distribution:
        return torch.distributions.Categorical(logits=self.logits(features))


ActionHead = GaussianHead | CategoricalHead


def _action_head(action_space: gym.Space, in_dim: int, config: PolicyConfig) -> ActionHead:
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return GaussianHead(in_dim, action_space.shape[0], config.log_std_init)
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalHead(in_dim, int(action_space.n))
    raise ValueError(
        f"no action head for {action_space}; supported: Box of shape (A,) (Gaussian), Discrete (categorical)"
    )


# ----------------------------------------------------------------------------------- actor-critic


class ActorCritic(nn.Module):
    """An encoder-trunk actor with an action head, and a value head on its own or the shared trunk."""

    def __init__(
        self, actor_trunk: nn.Module, head: ActionHead, critic_trunk: nn.Module | None
    ) -> None:
        super().__init__()
        self.actor_trunk = actor_trunk
        self.head = head
        self.critic_trunk = critic_trunk  # None: the critic reads the actor's features
        trunk = critic_trunk if critic_trunk is not None else actor_trunk
        self.value_head = nn.Linear(trunk.out_dim, 1)

    def _features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actor = self.actor_trunk(obs)
        critic = actor if self.critic_trunk is None else self.critic_trunk(obs)
        return actor, critic

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> ActOutput:
        """Observations (B, *obs_shape) -> actions, log-probs (B,), values (B,); no gradients."""
        actor, critic = self._features(torch.as_tensor(obs))
        actions, logprobs = self.head.sample(actor, deterministic, generator)
        return ActOutput(actions, logprobs, self.value_head(critic).squeeze(-1))

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> EvalOutput:
        """(B, *obs_shape), (B, *action_shape) -> log-probs, entropy, values, each (B,); differentiable."""
        actor, critic = self._features(torch.as_tensor(obs))
        logprobs, entropy = self.head.log_prob_entropy(actor, torch.as_tensor(actions))
        return EvalOutput(logprobs, entropy, self.value_head(critic).squeeze(-1))

    def critic_parameters(self) -> list[nn.Parameter]:
        """The parameters only the value depends on: the value head, and the critic trunk if it has one."""
        own = [] if self.critic_trunk is None else list(self.critic_trunk.parameters())
        return own + list(self.value_head.parameters())

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, *obs_shape) -> values (B,)."""
        trunk = self.critic_trunk if self.critic_trunk is not None else self.actor_trunk
        return self.value_head(trunk(torch.as_tensor(obs))).squeeze(-1)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        """The action distribution at ``obs`` (B, *obs_shape) as a torch object."""
        return self.head.distribution(self.actor_trunk(torch.as_tensor(obs)))


def _orthogonal_init(policy: ActorCritic) -> None:
    for module in policy.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(module.weight, gain=math.sqrt(2))
            nn.init.zeros_(module.bias)
    # Small action-layer weights start the policy near its mean action, whatever the features.
    last = policy.head.mean if isinstance(policy.head, GaussianHead) else policy.head.logits
    nn.init.orthogonal_(last.weight, gain=0.01)
    nn.init.orthogonal_(policy.value_head.weight, gain=1.0)


def pick_encoder(obs_space: gym.Space, config: PolicyConfig) -> str:
    """The encoder name for ``obs_space``: the configured one, or cnn for 3-D Box images, else mlp."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"no encoder for observation space {obs_space}; supported: Box")
    if config.encoder != "auto":
        return config.encoder
    return "cnn" if len(obs_space.shape) == 3 else "mlp"


def build_actor_critic(
    obs_space: gym.Space, action_space: gym.Space, config: PolicyConfig | None = None
) -> ActorCritic:
    """An actor-critic for single-env spaces ``obs_space`` / ``action_space``."""
    config = config if config is not None else PolicyConfig()
    config.validate()
    make_trunk = ENCODERS[pick_encoder(obs_space, config)]
    actor_trunk = make_trunk(obs_space, config)
    critic_trunk = None if config.shared_critic else make_trunk(obs_space, config)
    policy = ActorCritic(actor_trunk, _action_head(action_space, actor_trunk.out_dim, config), critic_trunk)
    if config.ortho_init:
        _orthogonal_init(policy)
    return policy


def build_policy(obs_space: gym.Space, action_space: gym.Space, config: PolicyConfig | None = None) -> nn.Module:
    """The :class:`Policy` ``config.kind`` names for single-env spaces, from ``config.init_from`` when set."""
    config = config if config is not None else PolicyConfig()
    config.validate()
    if config.kind == "vla":
        from m2flow.models.vla import build_vla

        policy: nn.Module = build_vla(obs_space, action_space, config.vla)
    else:
        policy = build_actor_critic(obs_space, action_space, config)
    if config.init_from is not None:
        from m2flow.models.init_weights import load_policy_weights

        load_policy_weights(policy, config.init_from)
    return policy
