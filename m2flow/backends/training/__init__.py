"""Training backends: data-parallel strategies (replicated "ddp", sharded "fsdp") and optimizers.

``create_strategy(name, module, device)`` wraps a model for the ranks of the calling worker group
(``torch.distributed`` initialised by ``Worker.init_process_group``; one rank needs none).
"""

from m2flow.lazy import lazy_names

# Names resolve on first use: importing a submodule (``optim``, whose config section every training
# config holds) must not import torch through this package, so configs load without it.
_HOME = {"StrategyName": "base", "TrainingStrategy": "base", "register_strategy": "registry",
         "StrategyTraits": "registry", "strategy_traits": "registry",
         "DataParallelStrategy": "ddp", "create_strategy": "factory", "FSDP2Strategy": "fsdp",
         "OptimConfig": "optim", "build_optimizer": "optim", "build_scheduler": "optim", "lr_factor": "optim"}
__getattr__, __dir__ = lazy_names(__name__, _HOME)

__all__ = [
    "DataParallelStrategy",
    "FSDP2Strategy",
    "OptimConfig",
    "StrategyName",
    "StrategyTraits",
    "TrainingStrategy",
    "build_optimizer",
    "build_scheduler",
    "create_strategy",
    "lr_factor",
    "register_strategy",
    "strategy_traits",
]
