"""The run-level settings every workflow shares, declared and validated once.

A workflow's config dataclass extends ``RunConfig``: the keys below stay at the top level of its YAML
(``run_dir``, ``checkpoint_every``, ``resume`` ...) and mean the same in every workflow; the driver
(``driver/run.py``) is the only reader of most of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from m2flow.config.schema import option
from m2flow.metrics import MetricsConfig
from m2flow.runtime.cluster import ClusterConfig

AUTO = "auto"
"""The placement that lets the planner choose the plan."""

RUN_KEYS = ("auto", "run_dir", "resume", "plan_file", "steps", "total_env_steps", "checkpoint_every",
            "keep_checkpoints", "eval_every", "eval_size", "eval_episodes", "metrics", "trace", "fault_tolerance")
"""Config keys that change neither what a call costs nor the plans: a profile outlives changes to them, and a
run may be resumed under new values of them."""


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


@dataclass
class FaultToleranceConfig:
    """What a run does when a worker dies or hangs."""

    max_restarts: int = option(2, "restarts of the whole flow after a worker dies or hangs, each from the newest "
                                  "checkpoint this run wrote (0: the run fails at once)")
    iteration_timeout_s: float | None = option(
        None, "a component that gives no result for this long (within one iteration, an evaluation or a "
              "checkpoint) counts as hung (None: no limit)")

    def validate(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.iteration_timeout_s is not None and self.iteration_timeout_s <= 0:
            raise ValueError(f"iteration_timeout_s must be > 0 or None, got {self.iteration_timeout_s}")


@dataclass
class RunConfig:
    """The settings of a run that every workflow shares: cluster, placement, seed, run directory, cadence."""

    cluster: ClusterConfig = option(ClusterConfig(), "where the workers run")
    placement: str = option(
        "all", "devices of each component; shared devices are taken in turn; 'local': one rank each, all in this "
               "process (no Ray); 'auto': the planner chooses (see auto)")
    plan_file: str | None = option(
        None, "a plan.json to apply as it is (its devices, fusions, stages and micro-batch sizes) instead of "
              "planning from placement; it must fit this config's workflow and cluster")
    auto: AutoConfig = option(AutoConfig(), "how placement 'auto' profiles, chooses and re-plans")
    seed: int = option(0, "seed of data order, sampling, environments and initialisation")
    run_dir: str = option("runs/run", "where logs, metrics, checkpoints and the trace go")
    checkpoint_every: int = option(0, "save a checkpoint every this-many iterations and after the last (0: never)")
    keep_checkpoints: int | None = option(None, "keep only the newest this-many checkpoints (None: keep all)")
    resume: str | None = option(
        None, "'auto' (the newest checkpoint in run_dir written by a run of this config and seed, if any) or a "
              "checkpoint directory (any run's)")
    eval_every: int = option(
        0, "evaluate the policy before training, after every this-many iterations and after the last (0: never)")
    metrics: MetricsConfig = option(MetricsConfig(), "metric sinks")
    trace: bool = option(False, "record a timeline of every worker to run_dir/trace.json")
    fault_tolerance: FaultToleranceConfig = option(FaultToleranceConfig(), "restarts after a worker dies or hangs")

    def validate(self) -> None:
        for key in ("checkpoint_every", "eval_every"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.keep_checkpoints is not None and self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1 or None, got {self.keep_checkpoints}")
        if self.plan_file is not None and is_auto(self.placement):
            raise ValueError("plan_file and placement 'auto' exclude each other: a plan file is a plan already chosen")
