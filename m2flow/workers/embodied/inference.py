"""``PolicyEngine``: a rollout-side copy of the policy that turns observations into actions.

It samples from the actor-critic's action head only (no critic, no log-probabilities): the actor
recomputes old log-probabilities and values for the whole batch in one pass with the very weights
this copy acted with, which costs far less than doing it here on every step. Each env rank it
serves has its own random generator, so the actions an env sees do not depend on the order in
which the rollout happened to serve its sources, or on whether it ran in the env's own process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from m2flow.models.policies import ActorCritic, GaussianHead, PolicyConfig, build_policy


def source_seed(seed: int, source: int) -> int:
    """The seed of the action-noise generator serving env rank ``source``."""
    return (seed * 1_000_003 + 7919 * (source + 1)) % (2**63)


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
        self.policy: ActorCritic = build_policy(obs_space, action_space, policy_config).to(self.device)
        self.policy.requires_grad_(False)
        self.policy.eval()
        self._gaussian = isinstance(self.policy.head, GaussianHead)
        self._action_dtype = np.dtype(action_space.dtype) if self._gaussian else np.int64
        self.generators = {
            s: torch.Generator(device=self.device).manual_seed(source_seed(seed, s)) for s in sources
        }
        self._std: torch.Tensor | None = None

    # -- weights --------------------------------------------------------------------------------
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy a full actor-critic state dict into this copy."""
        self.policy.load_state_dict(weights)
        self._std = None

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """The live tensors of this copy, by name (``recv_weights`` copies into them in place)."""
        return self.policy.state_dict(keep_vars=True)

    def weights_changed(self) -> None:
        """Forget values cached from the weights (call after writing into ``weights``)."""
        self._std = None

    # -- acting ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def act(self, obs: np.ndarray, source: int, deterministic: bool = False) -> np.ndarray:
        """Actions for the (n, *obs_shape) observations of env rank ``source``."""
        return self.act_many([obs], [source], deterministic)[0]

    @torch.inference_mode()
    def act_many(
        self, obs: Sequence[np.ndarray], sources: Sequence[int], deterministic: bool = False
    ) -> list[np.ndarray]:
        """One forward pass over several sources' observations; their actions, in the same order."""
        sizes = [len(o) for o in obs]
        batch = torch.from_numpy(obs[0] if len(obs) == 1 else np.concatenate(obs))
        if batch.device != self.device:
            batch = batch.to(self.device, non_blocking=True)
        features = self.policy.actor_trunk(batch)
        if self._gaussian:
            actions = self._gaussian_actions(features, sizes, sources, deterministic)
        else:
            actions = self._categorical_actions(features, sizes, sources, deterministic)
        out = actions.cpu().numpy().astype(self._action_dtype, copy=False)
        if len(sizes) == 1:
            return [out]
        return np.split(out, np.cumsum(sizes)[:-1])

    def _gaussian_actions(self, features: torch.Tensor, sizes: list[int], sources: Sequence[int],
                          deterministic: bool) -> torch.Tensor:
        head = self.policy.head
        mean = head.mean(features)
        if deterministic:
            return mean
        if self._std is None:
            self._std = head.log_std.exp()
        noise = [torch.randn((n, mean.shape[1]), generator=self.generators[s], device=self.device)
                 for n, s in zip(sizes, sources)]
        return torch.addcmul(mean, self._std, noise[0] if len(noise) == 1 else torch.cat(noise))

    def _categorical_actions(self, features: torch.Tensor, sizes: list[int], sources: Sequence[int],
                             deterministic: bool) -> torch.Tensor:
        logits = self.policy.head.logits(features)
        if deterministic:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits, dim=-1)
        parts, start = [], 0
        for n, s in zip(sizes, sources):
            parts.append(torch.multinomial(probs[start : start + n], 1, generator=self.generators[s]))
            start += n
        return (parts[0] if len(parts) == 1 else torch.cat(parts)).squeeze(-1)

    # -- checkpoint and devices -----------------------------------------------------------------
    def rng_state(self) -> dict[int, torch.Tensor]:
        """The state of every source's generator."""
        return {s: g.get_state() for s, g in self.generators.items()}

    def load_rng_state(self, state: dict[int, Any]) -> None:
        for s, st in state.items():
            if s in self.generators:
                self.generators[s].set_state(st)

    def to(self, device: str | torch.device) -> None:
        """Move the weights (context switching); generators stay where they were made."""
        self.policy.to(device)
        self._std = None
