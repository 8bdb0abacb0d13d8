"""What each embodied worker is built with: one frozen settings object per worker class.

The embodied workflow builds them in one place (``workflows/embodied/settings.py``) from the config and
the Plan; a worker reads its own settings, never the config, for what the plan decides (pipeline
stages, who holds the policy, shared devices and offload, staleness). ``EmbodiedRolloutSettings`` is also
how the policy runs inside an env rank when the plan fuses the rollout into the env (``hosted_in``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from m2flow.envs import EnvConfig
from m2flow.models.policy_config import PolicyConfig
from m2flow.workers.embodied.config import ActorConfig, PPOConfig

if TYPE_CHECKING:
    from m2flow.runtime.worker import Worker
    from m2flow.workers.embodied.inference import PolicyEngine


@dataclass(frozen=True, kw_only=True)
class EmbodiedEnvSettings:
    """An env rank: its envs in the plan's pipeline stages, and where observations and trajectories go."""

    env: EnvConfig
    """the envs of one rank, in ``num_groups`` = the plan's pipeline stages, seeded by the run's seed"""
    rollout_steps: int
    """steps every env takes per iteration (T)"""
    actor_group: str
    actor_ranks: int
    rollout_group: str | None = None
    """the rollout group that runs the policy (None: the policy runs in this process, hosted)"""
    rollout_ranks: int = 1
    shares_devices: bool = False
    """the hosted policy takes turns with the actor on these devices (the plan's)"""
    offload: bool = False
    """the hosted policy is offloaded after each collection (the plan's)"""
    imports: tuple[str, ...] = ()
    """modules imported first (custom env ids)"""
    max_error_rate: float = 0.1
    """env exceptions per env step past which the run stops"""
    reset_groups: int = 0
    """GRPO: every iteration starts from a reset of every env, the envs in groups of this many sharing a seed
    (0: episodes run on across iterations)"""
    chunk: int = 1
    """env steps per decision: the policy's actions come in chunks of this many (``policy.vla.chunk``)"""
    chunk_discount: float = 1.0
    """the discount of the rewards inside a chunk (reward j of a chunk counts discount**j): gamma for GAE,
    1 for GRPO's undiscounted episode returns"""


@dataclass(frozen=True, kw_only=True)
class EmbodiedRolloutSettings:
    """A rollout rank (or the policy hosted in an env rank): the policy copy that acts for its env ranks."""

    obs_space: Any
    action_space: Any
    policy: PolicyConfig
    seed: int
    env_group: str
    env_ranks: int
    stages: int
    """the plan's pipeline stages of every env rank"""
    rollout_steps: int
    shares_devices: bool = False
    offload: bool = False

    def hosted_in(self, host: Worker) -> PolicyEngine:
        """The policy inside env rank ``host``: acting for that rank alone, on its device."""
        from m2flow.workers.embodied.inference import PolicyEngine

        return PolicyEngine(self.obs_space, self.action_space, self.policy, self.seed, [host.rank],
                            device=host.torch_device)


@dataclass(frozen=True, kw_only=True)
class EmbodiedActorSettings:
    """An actor rank: the policy it trains, PPO, the trajectories it takes, the plan's turns and staleness."""

    obs_space: Any
    action_space: Any
    policy: PolicyConfig
    ppo: PPOConfig
    actor: ActorConfig
    """backend, host sum, compile, skipped-update limit (its ``offload`` is the plan's, below)"""
    env_group: str
    env_ranks: int
    total_iterations: int
    seed: int = 0
    shares_devices: bool = False
    offload: bool = False
    """offload weights and optimizer state after each update (the plan's)"""
    batch_size: int | None = None
    """samples per iteration (to compile the update at start-up)"""
    max_staleness: int = 0
    """the plan's bound on how old a trajectory may be"""
