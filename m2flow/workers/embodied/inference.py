"""``PolicyEngine``: a rollout-side copy of the policy that turns observations into actions.

The actor recomputes old log-probabilities and values for the whole batch in one pass with the very
weights this copy acted with, which costs far less than doing it here on every step. A policy whose
``act`` returns the log-probabilities of what it sampled anyway (the VLA: the logits it sampled from)
hands them over too (``act_scored``): with bounded staleness they are the behaviour log-probs of the
decoupled objective, which the actor would otherwise score with a second pass under the old weights.

Each env rank it serves has its own random generator, so the actions an env sees do not depend on
the order in which the rollout served its sources, or on whether it ran in the env's own process.
Any policy runs through its ``act`` (``m2flow.models.policy_types.Policy``), one call per source
with that source's torch generator. The MLP / CNN actor-critic keeps a faster path of its own: it
samples from the action head only (no critic), with numpy's PCG64 per source; on the CPU, MLP
trunks run in numpy on a copy of the weights refreshed at every weight sync (for a batch of a few
observations one numpy call costs a microsecond or two where a torch operation costs several, and
that is paid on every env step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from m2flow.models.policies import ActorCritic, GaussianHead, MLPEncoder, PolicyConfig, build_policy
from m2flow.models.policy_types import Policy

_NUMPY_ACTIVATIONS = {nn.Tanh: np.tanh, nn.ReLU: lambda x: np.maximum(x, 0.0, out=x)}


def source_seed(seed: int, source: int) -> int:
    """The seed of the action-noise generator serving env rank ``source``."""
    return (seed * 1_000_003 + 7919 * (source + 1)) % (2**63)


class _NumpyActor:
    """The actor trunk and action head of an MLP policy as numpy arrays (weights transposed)."""

    def __init__(self, policy: ActorCritic) -> None:
        self.layers: list[tuple[np.ndarray, np.ndarray, Any]] = []
        modules = [m for m in policy.actor_trunk.net if not isinstance(m, nn.Flatten)]
        for linear, act in zip(modules[0::2], modules[1::2]):
            self.layers.append((_t(linear.weight), linear.bias.detach().cpu().numpy().copy(),
                                _NUMPY_ACTIVATIONS[type(act)]))
        head = policy.head
        out = head.mean if isinstance(head, GaussianHead) else head.logits
        self.out_w, self.out_b = _t(out.weight), out.bias.detach().cpu().numpy().copy()
        self.std = head.log_std.detach().exp().cpu().numpy().copy() if isinstance(head, GaussianHead) else None

    @staticmethod
    def supports(policy: ActorCritic) -> bool:
        if not isinstance(policy.actor_trunk, MLPEncoder):
            return False
        modules = [m for m in policy.actor_trunk.net if not isinstance(m, nn.Flatten)]
        return all(isinstance(lin, nn.Linear) and type(act) in _NUMPY_ACTIVATIONS
                   for lin, act in zip(modules[0::2], modules[1::2])) and len(modules) % 2 == 0

    def head_out(self, obs: np.ndarray) -> np.ndarray:
        """(B, *obs_shape) -> the head's output (B, A): Gaussian means or logits."""
        x = obs.reshape(obs.shape[0], -1)
        for w, b, act in self.layers:
            y = x @ w
            y += b
            x = act(y)
        y = x @ self.out_w
        y += self.out_b
        return y


def _t(weight: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(weight.detach().cpu().numpy().T)


class PolicyEngine:
    """Policy inference for one or more env ranks: (n, *obs_shape) numpy in, (n, *action_shape) out."""

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        policy_config: PolicyConfig,
        seed: int,
        sources: Sequence[int],
        device: str | torch.device = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.policy: Policy = build_policy(obs_space, action_space, policy_config).to(self.device)
        self.policy.requires_grad_(False)
        self.policy.eval()
        self._actor_critic = isinstance(self.policy, ActorCritic)
        """The actor-critic's own path (its head, numpy generators); otherwise ``policy.act``."""
        self._gaussian = self._actor_critic and isinstance(self.policy.head, GaussianHead)
        discrete = self._actor_critic and not self._gaussian
        self._action_dtype = np.dtype(np.int64) if discrete else np.dtype(action_space.dtype)
        self.generators: dict[int, Any]
        if self._actor_critic:
            self.generators = {s: np.random.Generator(np.random.PCG64(source_seed(seed, s))) for s in sources}
        else:
            self.generators = {s: torch.Generator(self.device).manual_seed(source_seed(seed, s)) for s in sources}
        self._use_numpy = self.device.type == "cpu" and self._actor_critic and _NumpyActor.supports(self.policy)
        self._numpy: _NumpyActor | None = None
        self._std: torch.Tensor | None = None

    # -- weights --------------------------------------------------------------------------------
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy a full actor-critic state dict into this copy."""
        self.policy.load_state_dict(weights)
        self.weights_changed()

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """The live tensors of this copy, by name (``recv_weights`` copies into them in place)."""
        return self.policy.state_dict(keep_vars=True)

    def weights_changed(self) -> None:
        """Refresh what is derived from the weights (call after writing into ``weights``)."""
        self._std = None
        self._numpy = _NumpyActor(self.policy) if self._use_numpy else None

    # -- acting ---------------------------------------------------------------------------------
    def act(self, obs: np.ndarray, source: int, deterministic: bool = False) -> np.ndarray:
        """Actions for the (n, *obs_shape) observations of env rank ``source``."""
        return self.act_many([obs], [source], deterministic)[0]

    def act_many(
        self, obs: Sequence[np.ndarray], sources: Sequence[int], deterministic: bool = False
    ) -> list[np.ndarray]:
        """One forward pass over several sources' observations; their actions, in the same order."""
        if not self._actor_critic:
            return [self._act_policy(o, s, deterministic)[0] for o, s in zip(obs, sources)]
        return self._act_actor_critic(obs, sources, deterministic)

    def act_scored(
        self, obs: Sequence[np.ndarray], sources: Sequence[int]
    ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """As ``act_many`` (sampled actions), each source's actions with their (n,) float32 log-probabilities
        (every token of an action chunk together) where the policy's ``act`` computes them, None otherwise
        (the actor-critics' fast path samples from the action head alone)."""
        if not self._actor_critic:
            return [self._act_policy(o, s, False) for o, s in zip(obs, sources)]
        return [(a, None) for a in self._act_actor_critic(obs, sources, False)]

    def _act_actor_critic(
        self, obs: Sequence[np.ndarray], sources: Sequence[int], deterministic: bool
    ) -> list[np.ndarray]:
        sizes = [len(o) for o in obs]
        batch = obs[0] if len(obs) == 1 else np.concatenate(obs)
        out = self._head_out(batch)  # (B, A): means or logits
        if self._gaussian:
            if not deterministic:
                std = self._numpy.std if self._numpy is not None else self._torch_std()
                noise = [self.generators[s].standard_normal((n, out.shape[1]), dtype=np.float32)
                         for n, s in zip(sizes, sources)]
                out += std * (noise[0] if len(noise) == 1 else np.concatenate(noise))
            actions = out.astype(self._action_dtype, copy=False)
        elif deterministic:
            actions = out.argmax(axis=1)
        else:  # Gumbel-max: argmax(logits + Gumbel noise) samples the softmax
            uniform = [self.generators[s].random((n, out.shape[1])) for n, s in zip(sizes, sources)]
            u = uniform[0] if len(uniform) == 1 else np.concatenate(uniform)
            actions = (out - np.log(-np.log(np.maximum(u, 1e-300)))).argmax(axis=1)
        if len(sizes) == 1:
            return [actions]
        return np.split(actions, np.cumsum(sizes)[:-1])

    def _act_policy(self, obs: np.ndarray, source: int, deterministic: bool) -> tuple[np.ndarray, np.ndarray]:
        """Any policy: its ``act`` on one source's observations, sampling from that source's generator;
        the actions and their (n,) joint log-probabilities."""
        with torch.inference_mode():
            x = torch.from_numpy(obs).to(self.device, non_blocking=True)
            out = self.policy.act(x, deterministic, generator=self.generators[source])
            logprobs = out.logprobs.reshape(len(obs), -1).sum(-1)  # per token (n, S) or joint (n,)
            return (out.actions.cpu().numpy().astype(self._action_dtype, copy=False),
                    logprobs.float().cpu().numpy())

    def _head_out(self, batch: np.ndarray) -> np.ndarray:
        if self._numpy is not None:
            return self._numpy.head_out(batch)
        if self._use_numpy:  # no weights synced yet: take the initial ones
            self.weights_changed()
            return self._numpy.head_out(batch)
        with torch.inference_mode():
            x = torch.from_numpy(batch).to(self.device, non_blocking=True)
            features = self.policy.actor_trunk(x)
            head = self.policy.head
            out = head.mean(features) if self._gaussian else head.logits(features)
            return out.float().cpu().numpy()

    def _torch_std(self) -> np.ndarray:  # the actor-critic's Gaussian head only
        if self._std is None:
            self._std = self.policy.head.log_std.detach().exp().float().cpu()
        return self._std.numpy()

    # -- checkpoint and devices -----------------------------------------------------------------
    def rng_state(self) -> dict[int, Any]:
        """The state of every source's generator (numpy's state dict, or a torch generator's bytes)."""
        if not self._actor_critic:
            return {s: g.get_state() for s, g in self.generators.items()}
        return {s: g.bit_generator.state for s, g in self.generators.items()}

    def load_rng_state(self, state: dict[int, Any]) -> None:
        for s, st in state.items():
            if s not in self.generators:
                continue
            if self._actor_critic:
                self.generators[s].bit_generator.state = st
            else:
                self.generators[s].set_state(st)

    def to(self, device: str | torch.device) -> None:
        """Move the torch weights (context switching)."""
        self.policy.to(device)
        self._std = None
