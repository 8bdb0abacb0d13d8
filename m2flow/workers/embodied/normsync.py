"""Keeping the normalisation statistics of several env ranks identical.

Each env rank folds the observations (and discounted returns) it sees into its own running
moments. After an iteration every rank reports the moments of just the samples it added (the
difference between its statistics now and at the last merge); every rank then starts the next
iteration from the last merged statistics plus all ranks' additions, folded in rank order. All
ranks thus normalise with the statistics of every sample seen by any rank up to the last merge,
plus their own since, and those statistics are identical across ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from m2flow.envs import RunningMeanStd, VecEnv

Moments = tuple[np.ndarray, np.ndarray, float]  # mean, var, count


def moments_between(before: dict[str, Any], after: dict[str, Any]) -> Moments | None:
    """Population moments of the samples folded in between two ``RunningMeanStd.state_dict()``s."""
    n0, n1 = float(before["count"]), float(after["count"])
    n = n1 - n0
    if n <= 0:
        return None
    m0, v0 = np.asarray(before["mean"]), np.asarray(before["var"])
    m1, v1 = np.asarray(after["mean"]), np.asarray(after["var"])
    mean = (n1 * m1 - n0 * m0) / n
    second = (n1 * (v1 + m1 * m1) - n0 * (v0 + m0 * m0)) / n
    var = np.maximum(second - mean * mean, 0.0)  # rounding can leave a tiny negative
    return mean, var, n


def _pieces(vec: VecEnv) -> dict[str, RunningMeanStd]:
    out = {}
    if vec.obs_normalizer is not None:
        out["obs"] = vec.obs_normalizer.rms
    if vec.reward_scaler is not None:
        out["ret"] = vec.reward_scaler.rms
    return out


class NormSync:
    """The merge bookkeeping of one env rank (see the module docstring)."""

    def __init__(self, vec: VecEnv) -> None:
        self.vec = vec
        # Before the first merge the shared statistics hold no samples: what the rank has folded in
        # already (its reset observations) belongs to its first delta, so every rank receives it.
        self.base = {k: RunningMeanStd(rms.shape).state_dict() for k, rms in _pieces(vec).items()}

    def delta(self) -> dict[str, Moments | None]:
        """The moments this rank added since the last merge."""
        return {k: moments_between(self.base[k], rms.state_dict()) for k, rms in _pieces(self.vec).items()}

    def merge(self, deltas: list[dict[str, Moments | None]]) -> None:
        """Set the statistics to the last merge plus every rank's additions, in rank order."""
        for key, rms in _pieces(self.vec).items():
            rms.load_state_dict(self.base[key])
            for delta in deltas:
                piece = delta.get(key)
                if piece is not None:
                    rms.update_from_moments(*piece)
            self.base[key] = rms.state_dict()

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base = state["base"]
