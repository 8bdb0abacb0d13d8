"""Config schemas used by the config tests: every kind of field the converter supports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from m2flow.config import option


class Backend(enum.Enum):
    TORCH = "torch"
    FSDP = "fsdp"


@dataclass
class ClusterCfg:
    """Where to run."""

    address: str | None = option(None, "Ray address; None starts a local instance")
    num_cpus: int = option(2, "CPUs Ray may use")
    placement: str = option("all", "placement spec")

    def validate(self) -> None:
        if self.num_cpus < 1:
            raise ValueError(f"num_cpus: must be >= 1, got {self.num_cpus}")
        if self.placement == "bad":
            raise ValueError("this placement cannot be parsed")


@dataclass
class OptimCfg:
    lr: float = option(1e-3, "learning rate")
    betas: tuple[float, float] = option((0.9, 0.999), "Adam betas")
    steps: int = option(100, "optimizer steps")


@dataclass
class StageCfg:
    name: str = option(doc="stage name")
    envs: int = option(1, "environments in this stage")

    def __post_init__(self) -> None:
        if self.envs > 64:
            raise ValueError(f"envs: at most 64 per stage, got {self.envs}")


@dataclass
class ActorCfg:
    model_path: Path = option(doc="directory of the model")
    mode: Literal["collocated", "disaggregated", "hybrid"] = option("collocated", "execution mode")
    backend: Backend = option(Backend.TORCH, "training backend")
    optim: OptimCfg = option(OptimCfg(), "optimizer settings")
    micro_batch_sizes: list[int] = option([1, 2], "micro-batch sizes to try")
    loss_weights: dict[str, float] = option({"pg": 1.0}, "weight of each loss term")
    use_kl: bool = option(False, "add a KL penalty")
    max_grad_norm: float | None = option(None, "gradient clipping norm; None disables it")
    tags: tuple[str, ...] = option((), "free-form tags")


@dataclass
class TrainCfg:
    """A tiny training workflow."""

    actor: ActorCfg = option(doc="the actor")
    name: str = option("run", "run name")
    seed: int = option(0, "random seed")
    cluster: ClusterCfg = option(ClusterCfg(), "cluster settings")
    stages: list[StageCfg] = option([], "pipeline stages")

    def validate(self) -> None:
        if self.actor.mode != "collocated" and self.cluster.num_cpus < 2:
            raise ValueError(
                f"actor.mode: {self.actor.mode!r} needs cluster.num_cpus >= 2, "
                f"got {self.cluster.num_cpus}"
            )


@dataclass
class Undocumented:
    documented: int = option(1, "has a doc")
    bare: int = 2
    plain: str = field(default="x", metadata={"doc": "documented with field(metadata=...)"})
