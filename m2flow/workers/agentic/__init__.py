"""Agentic RL's rollout core, free of Ray: multi-turn episodes over text environments and tools.

- ``turn_loop.py``   ``play_turns``: the one turn loop, between a ``TurnPolicy`` and a ``TurnEnvs``
- ``episode.py``     ``run_episodes``: model turns and observations until each episode ends or a budget is spent
- ``turns.py``       ``TurnEngine``: the model's half of each round (contexts, budgets, re-runs)
- ``env_worker.py``  ``EnvWorker`` / ``TextEnvs``: many text environments per process, stepped by trajectory id
- ``rollout_worker.py`` ``AgenticRolloutWorker``: model turns; each finished GRPO group streamed to the actor
- ``partial_episodes.py`` ``PartialEpisodes``: partial rollouts, the groups held across iterations and one iteration's quota
- ``trajectory.py``  ``Trajectory`` (ids, action mask, log-probs, per-turn rewards) and ``to_rollout_batch``
"""

from m2flow.workers.agentic.episode import EpisodeConfig, EpisodeStats, run_episodes, turn_seed
from m2flow.workers.agentic.trajectory import BUDGET_REASONS, FinishReason, Trajectory, to_rollout_batch

__all__ = [
    "BUDGET_REASONS",
    "EpisodeConfig",
    "EpisodeStats",
    "FinishReason",
    "Trajectory",
    "run_episodes",
    "to_rollout_batch",
    "turn_seed",
]
