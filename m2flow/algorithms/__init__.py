"""RL algorithm math as pure tensor functions, registered by name.

Nothing here imports Ray, the runtime or config trees. The registries ``ADV_ESTIMATORS``
(estimators.py), ``POLICY_LOSSES`` (losses.py), ``KL_ESTIMATORS`` (kl.py) and ``LOSS_AGGREGATIONS``
(aggregation.py) know their built-in names without importing those modules, so a config checks a
name without torch; a name's function is loaded on first use. ``ppo_minibatch_loss``
(minibatch_ppo.py) is the embodied PPO loss, exported plainly: its call shape (unmasked (B,) samples,
the scale folded into the advantages) is not the registered policy losses' one.
"""

from m2flow.lazy import lazy_names

# Names resolve on first use (the registries' home, registry.py, imports no torch).
_HOME = {
    "ADV_ESTIMATORS": "registry", "KL_ESTIMATORS": "registry", "LOSS_AGGREGATIONS": "registry",
    "POLICY_LOSSES": "registry", "Registry": "registry", "UnknownNameError": "registry",
    "aggregate": "aggregation",
    "DynamicSamplingResult": "dapo", "dynamic_sampling_filter": "dapo", "overlong_penalty": "dapo",
    "AdvantageOutput": "estimators", "StepBatch": "estimators", "TokenBatch": "estimators",
    "compute_advantages": "estimators",
    "kl_estimate": "kl", "kl_loss": "kl", "kl_penalty": "kl",
    "LossOutput": "losses", "entropy_bonus": "losses", "entropy_from_logits": "losses", "policy_loss": "losses",
    "value_loss": "losses",
    "ppo_minibatch_loss": "minibatch_ppo",
}
__getattr__, __dir__ = lazy_names(__name__, _HOME)

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
