"""Training backends: data-parallel strategies (replicated "ddp", sharded "fsdp") and optimizers.

``create_strategy(name, module, device)`` wraps a model for the ranks of the calling worker group
(``torch.distributed`` initialised by ``Worker.init_process_group``; one rank needs none).
"""

from m2flow.backends.training.base import StrategyName, TrainingStrategy, register_strategy
from m2flow.backends.training.ddp import DataParallelStrategy
from m2flow.backends.training.factory import create_strategy
from m2flow.backends.training.fsdp import FSDP2Strategy
from m2flow.backends.training.optim import OptimConfig, build_optimizer, build_scheduler, lr_factor

__all__ = [
    "DataParallelStrategy",
    "FSDP2Strategy",
    "OptimConfig",
    "StrategyName",
    "TrainingStrategy",
    "build_optimizer",
    "build_scheduler",
    "create_strategy",
    "lr_factor",
    "register_strategy",
]
