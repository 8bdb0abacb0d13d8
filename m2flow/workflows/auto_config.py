"""The ``auto:`` section of a workflow config, and which config keys a profile does not depend on.

``placement: auto`` makes the run choose its own plan (``auto.py``): it loads or takes a profile,
searches the plans, runs the fastest, and re-plans when the measured times drift from the
predicted ones. These settings say how.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from m2flow.config.schema import option

AUTO = "auto"
"""The placement that lets the planner choose the plan."""

RUN_KEYS = ("auto", "run_dir", "resume", "steps", "total_env_steps", "checkpoint_every", "keep_checkpoints",
            "eval_every", "eval_size", "eval_episodes", "metrics", "trace", "fault_tolerance")
"""Config keys that change neither what a call costs nor the plans: a profile outlives changes to them."""


def is_auto(placement: str) -> bool:
    return placement.strip() == AUTO


@dataclass
class AutoConfig:
    """How ``placement: auto`` profiles, chooses and re-plans."""

    profile: str | None = option(
        None, "profile file to use, or to write when it is missing, stale or foreign (None: run_dir/profile.json)")
    profile_iterations: int = option(
        4, "iterations of each profiling run; the first is a warm-up, the least of the rest counts")
    profile_devices: int | None = option(
        None, "largest rank count profiled (None: the cluster's devices, on CPUs as far as the cores allow)")
    replan: bool = option(True, "re-plan at a checkpoint when measured times drift from the prediction "
                                "(needs checkpoint_every > 0)")
    drift_threshold: float = option(
        0.5, "a component drifts when its measured / predicted time leaves [1 / (1 + this), 1 + this]")
    drift_window: int = option(4, "iterations whose median ratio must be outside the band (sustained drift)")
    max_replans: int = option(2, "plan switches at most in one run")

    def validate(self) -> None:
        if self.profile_iterations < 2:
            raise ValueError(
                f"profile_iterations must be >= 2 (one warm-up, one measured), got {self.profile_iterations}")
        if self.profile_devices is not None and self.profile_devices < 1:
            raise ValueError(f"profile_devices must be >= 1 or None, got {self.profile_devices}")
        if not self.drift_threshold > 0:
            raise ValueError(f"drift_threshold must be > 0, got {self.drift_threshold}")
        if self.drift_window < 1:
            raise ValueError(f"drift_window must be >= 1, got {self.drift_window}")
        if self.max_replans < 0:
            raise ValueError(f"max_replans must be >= 0, got {self.max_replans}")


def profile_hash(cfg: Any, space: Any) -> str:
    """The hash a profile of ``cfg`` carries: the config without the keys the search varies (``space``:
    a ``SearchSpace``) and without ``RUN_KEYS``."""
    from m2flow.planner.profile import config_hash

    varied = ("placement", "cluster", *space.knobs, *space.fusion_keys.values(), *RUN_KEYS)
    return config_hash(asdict(cfg), ignore=varied)


@dataclass(frozen=True)
class AutoSupport:
    """What a workflow tells ``m2flow profile`` and ``placement: auto`` about itself."""

    timings: Mapping[str, str]
    """component -> the iteration metric holding its busy seconds (the slowest rank's)"""
    probes: Callable[[Any], list[dict[str, Any]]]
    """``probes(cfg)``: the config overrides of each batch size to profile (one run each)"""
    length: Callable[[Any, int], dict[str, Any]]
    """``length(cfg, iterations)``: the overrides that make a run that many iterations long, and
    switch off what a profiling run does not need (warm starts, evaluations)"""
    profile_fusions: Mapping[str, bool]
    """fusion keys set while profiling, so that each process runs one component at a time"""
    train: Callable[..., Any]
    """``train(cfg, cluster, watch)``: a run whose result has ``history`` (metrics per iteration)"""
    iterations: Callable[[Any, Any], int]
    """``iterations(cfg, plan)``: iterations of the whole run"""
    edge_bytes: Callable[[Any], dict[str, float]]
    """``edge_bytes(cfg)``: bytes per item of each data edge (from the config's shapes)"""
    model_bytes: Callable[[Any], tuple[float, float]]
    """``model_bytes(checkpoint)``: (bytes of the policy's weights, bytes of the actor's whole training
    state) read from a checkpoint directory a profiling run wrote (None: none was written; zeros)"""
    resumable: Callable[[Any, Any], bool] = lambda old, new: True
    """``resumable(old_plan, new_plan)``: a checkpoint written under the old plan can be resumed under the new"""
    thread_keys: Mapping[str, str] = field(default_factory=dict)
    """component -> the config key of its torch threads (a probe at one thread measures how it scales)"""
