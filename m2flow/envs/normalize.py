"""Running observation / reward normalisation: the two statistics pieces of the env pipeline.

The env pipeline of one worker is, per step of a group of environments::

    raw step -> episode statistics (raw rewards) -> ObsNormalizer -> RewardScaler -> policy

Both pieces follow Stable-Baselines3's ``VecNormalize`` so that learning curves are comparable:

- ``ObsNormalizer``: ``clip((obs - mean) / sqrt(var + eps), -clip, clip)`` with running moments of
  every observation returned to the policy (reset observations included); the true last
  observation of a finished episode is normalised with the same statistics but never counted.
- ``RewardScaler``: keeps a per-env discounted return ``R = gamma * R + r`` (zeroed when an episode
  ends), tracks its running variance, and returns ``clip(r / sqrt(var(R) + eps), -clip, clip)``.
  The mean is *not* subtracted: shifting rewards would change the optimal policy.

Deviation from SB3: ``RunningMeanStd`` starts from zero samples instead of a prior of 1e-4
samples with mean 0 / var 1, so its moments are exactly those of the data seen (the prior's weight
is gone after the first batch anyway).

Both pieces are checkpointable (``state_dict`` / ``load_state_dict``) and can be frozen
(``update=False``) for evaluation with the training statistics.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _clip(x: np.ndarray, bound: float) -> np.ndarray:
    """``x`` clipped to [-bound, bound] in place; two ufuncs beat ``np.clip``'s dispatch on tiny arrays."""
    return np.minimum(np.maximum(x, -bound, out=x), bound, out=x)


class RunningMeanStd:
    """Running mean and (population) variance of arrays of shape ``shape``, merged batch by batch.

    Uses the parallel update of Chan et al. (1979), so statistics gathered on several workers can be
    merged exactly with :meth:`update_from_moments`.
    """

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.shape = tuple(shape)
        self.mean = np.zeros(self.shape, dtype=np.float64)
        self.var = np.ones(self.shape, dtype=np.float64)
        self.count = 0.0

    def update(self, batch: np.ndarray) -> None:
        """Fold in a batch of shape ``(n, *shape)``."""
        batch = np.asarray(batch, dtype=np.float64)
        if batch.shape[1:] != self.shape:
            raise ValueError(f"expected a batch of shape (n, *{self.shape}), got {batch.shape}")
        n = batch.shape[0]
        if n == 0:
            return
        # Plain ufunc reductions: np.mean / np.var cost tens of microseconds of overhead per call,
        # which shows on every env step.
        mean = np.add.reduce(batch, axis=0) / n
        var = np.add.reduce(np.square(batch - mean), axis=0) / n
        self.update_from_moments(mean, var, float(n))

    def update_from_moments(self, mean: np.ndarray, var: np.ndarray, count: float) -> None:
        """Fold in ``count`` samples with population moments ``mean`` / ``var`` (e.g. another rank's)."""
        if count <= 0:
            return
        if self.count == 0:
            self.mean = np.array(mean, dtype=np.float64).reshape(self.shape)
            self.var = np.array(var, dtype=np.float64).reshape(self.shape)
            self.count = float(count)
            return
        total = self.count + count
        w = count / total  # weight of the new samples; scalars first keeps the array ops few
        delta = mean - self.mean
        self.mean = self.mean + delta * w
        self.var = self.var * (1.0 - w) + var * w + delta * delta * (w * (1.0 - w))
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        """Copies of the moments and the sample count."""
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore moments saved by :meth:`state_dict`; the shape must match."""
        mean = np.asarray(state["mean"], dtype=np.float64)
        if mean.shape != self.shape:
            raise ValueError(f"state has shape {mean.shape}, this RunningMeanStd has {self.shape}")
        self.mean = mean.copy()
        self.var = np.asarray(state["var"], dtype=np.float64).copy()
        self.count = float(state["count"])


class ObsNormalizer:
    """Normalises observations with running moments and clips them to ``[-clip, clip]``."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, epsilon: float = 1e-8) -> None:
        self.rms = RunningMeanStd(shape)
        self.clip = clip
        self.epsilon = epsilon
        # 1/std is cached against the identity of the variance array: every update replaces it.
        self._inv_std_of: np.ndarray | None = None
        self._inv_std = np.ones(shape)

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        """Normalise ``obs`` of shape ``(n, *shape)`` (after folding it in when ``update``); float32."""
        if update:
            self.rms.update(obs)
        return self.normalize(obs)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """Normalise ``obs`` of shape ``(n, *shape)`` with the current statistics, without updating."""
        if self._inv_std_of is not self.rms.var:
            self._inv_std = 1.0 / np.sqrt(self.rms.var + self.epsilon)
            self._inv_std_of = self.rms.var
        scaled = (obs - self.rms.mean) * self._inv_std
        return _clip(scaled, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"rms": self.rms.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.load_state_dict(state["rms"])


class RewardScaler:
    """Divides rewards by the running std of each env's discounted return, then clips them."""

    def __init__(
        self, num_envs: int, gamma: float = 0.99, clip: float = 10.0, epsilon: float = 1e-8
    ) -> None:
        self.rms = RunningMeanStd(())
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.gamma = gamma
        self.clip = clip
        self.epsilon = epsilon

    def __call__(
        self, rewards: np.ndarray, dones: np.ndarray, envs: slice = slice(None), update: bool = True
    ) -> np.ndarray:
        """Scale ``rewards`` (shape (n,)) of the envs ``envs``; ``dones`` (n,) ends their returns; float32."""
        if update:
            returns = self.returns[envs] * self.gamma + rewards
            self.rms.update(returns)
            # An ended episode's return must not leak into the next episode's estimate.
            self.returns[envs] = np.where(dones, 0.0, returns)
        scaled = rewards / np.sqrt(self.rms.var + self.epsilon)
        return _clip(scaled, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"rms": self.rms.state_dict(), "returns": self.returns.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.load_state_dict(state["rms"])
        returns = np.asarray(state["returns"], dtype=np.float64)
        if returns.shape != self.returns.shape:
            raise ValueError(
                f"state tracks {returns.shape[0]} envs, this RewardScaler has {self.returns.shape[0]}"
            )
        self.returns = returns.copy()
