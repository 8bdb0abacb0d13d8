"""The workflow components as workers.

Reasoning RL: ``rollout.RolloutWorker`` (generation), ``reward.RewardWorker`` (scoring),
``inference.InferenceWorker`` (old-policy and reference log-probs), ``actor.ActorWorker`` (policy and
critic updates). Import them from their modules; this package imports nothing heavy.
"""
