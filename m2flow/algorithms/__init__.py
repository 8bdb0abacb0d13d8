"""RL algorithm math as pure tensor functions, registered by name.

Nothing here imports Ray, the runtime or config trees. Importing the package fills the registries:
``ADV_ESTIMATORS`` (estimators.py), ``POLICY_LOSSES`` (losses.py), ``KL_ESTIMATORS`` (kl.py) and
``LOSS_AGGREGATIONS`` (aggregation.py). ``ppo_minibatch_loss`` (minibatch_ppo.py) is the embodied PPO
loss, exported plainly: its call shape (unmasked (B,) samples, the scale folded into the advantages)
is not the registered policy losses' one.
"""

from m2flow.algorithms.aggregation import aggregate
from m2flow.algorithms.dapo import DynamicSamplingResult, dynamic_sampling_filter, overlong_penalty
from m2flow.algorithms.estimators import AdvantageOutput, StepBatch, TokenBatch, compute_advantages
from m2flow.algorithms.kl import kl_estimate, kl_loss, kl_penalty
from m2flow.algorithms.losses import LossOutput, entropy_bonus, entropy_from_logits, policy_loss, value_loss
from m2flow.algorithms.minibatch_ppo import ppo_minibatch_loss
from m2flow.algorithms.registry import (
    ADV_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
)

__all__ = [
    "ADV_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "AdvantageOutput",
    "DynamicSamplingResult",
    "LossOutput",
    "Registry",
    "StepBatch",
    "TokenBatch",
    "UnknownNameError",
    "aggregate",
    "compute_advantages",
    "dynamic_sampling_filter",
    "entropy_bonus",
    "entropy_from_logits",
    "kl_estimate",
    "kl_loss",
    "kl_penalty",
    "overlong_penalty",
    "policy_loss",
    "ppo_minibatch_loss",
    "value_loss",
]
