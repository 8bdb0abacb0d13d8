"""The config of the embodied RL workflow (``workflow: embodied``): envs, policy, PPO, workers, run."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass

from m2flow.config.schema import option
from m2flow.driver.run_config import RunConfig, is_auto
from m2flow.envs import EnvConfig
from m2flow.metrics import MetricsConfig
from m2flow.models.policy_config import PolicyConfig
from m2flow.runtime.cluster import expected_layout
from m2flow.workflows.embodied.graph import COMPONENTS
from m2flow.runtime.placement import SYNTAX_LAYOUT_DEVICES, NodeLayout, PlacementError, PlacementPlan, parse_placement
from m2flow.workers.embodied.config import ActorConfig, EnvWorkerConfig, PPOConfig, RolloutConfig


@dataclass
class EmbodiedConfig(RunConfig):
    """Embodied RL: PPO on vectorised simulators with env, rollout and actor workers."""

    placement: str = option(
        "env,rollout,actor: 0",
        "devices of each component (env, rollout, actor); components on shared devices take turns; "
        "'local': one rank each, all in this process (no Ray); 'auto': the planner chooses (see auto)")
    run_dir: str = option("runs/embodied", "where logs, metrics, checkpoints and the trace go")
    metrics: MetricsConfig = option(
        MetricsConfig(key_metrics=["env/episode_return_recent", "time/env_steps_per_s"]), "metric sinks")
    env: EnvConfig = option(EnvConfig(), "the environments of each env rank and their normalisation")
    pipeline_stages: int = option(
        1, "K: each env rank's envs form K stages; one simulates while another's actions are inferred")
    rollout_steps: int = option(
        256, "steps every env takes per iteration (T); the batch is T x all envs. With action chunks "
        "(policy.vla.chunk = K) T counts decisions, each up to K env steps")
    total_env_steps: int = option(1_000_000, "train until this many env steps (whole iterations)")
    policy: PolicyConfig = option(PolicyConfig(), "the policy: an MLP / CNN actor-critic or the small VLA (policy.kind)")
    algorithm: PPOConfig = option(PPOConfig(), "PPO and GAE")
    env_worker: EnvWorkerConfig = option(EnvWorkerConfig(), "the env ranks")
    rollout: RolloutConfig = option(RolloutConfig(), "the rollout ranks")
    actor: ActorConfig = option(ActorConfig(), "the actor ranks")
    eval_episodes: int = option(10, "episodes per evaluation (deterministic actions, frozen statistics)")
    return_window: int = option(100, "finished episodes averaged in env/episode_return_recent")

    def validate(self) -> None:
        super().validate()
        if self.env.seed != 0:
            raise ValueError("env.seed: leave it at 0 and set the top-level 'seed' (it seeds the envs too)")
        if self.env.num_groups != 1:
            raise ValueError("env.num_groups: set 'pipeline_stages' instead (it splits each env rank's envs)")
        if not 1 <= self.pipeline_stages <= self.env.num_envs:
            raise ValueError(
                f"pipeline_stages must be in [1, env.num_envs={self.env.num_envs}], got {self.pipeline_stages}")
        for key in ("rollout_steps", "total_env_steps", "eval_episodes", "return_window"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for module in self.env_worker.imports:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ValueError(f"env_worker.imports: cannot import {module!r}: {e}") from None
        algo = self.algorithm
        if algo.advantage == "grpo":
            if self.env.num_envs % algo.group_size:
                raise ValueError(f"env.num_envs ({self.env.num_envs}) must be a multiple of algorithm.group_size "
                                 f"({algo.group_size}): a group's envs sit on one env rank")
            limit = self.env.max_episode_steps or self.env.env_kwargs.get("max_episode_steps")  # MetaWorld's own
            steps = self.rollout_steps * self.policy.action_chunk  # env steps an iteration reaches at least
            if limit is None or limit > steps:
                raise ValueError(f"advantage 'grpo' scores whole episodes: set env.max_episode_steps to at most "
                                 f"rollout_steps x policy.vla.chunk ({steps}), got {limit}")
        if self.env.backend == "gymnasium":
            from m2flow.envs.factory import check_env_id

            check_env_id(self.env.env_id)  # fail before any worker starts
        if self.env.backend == "metaworld":  # names and instructions only: the package itself is not needed here
            from m2flow.envs.metaworld import expand_tasks

            expand_tasks(self.env.env_id, self.env.env_kwargs.get("instruction"))
        if is_auto(self.placement):  # the planner checks each plan it considers
            return
        plan = self.placed()
        self.check_ranks({c: plan[c].world_size for c in COMPONENTS})

    def check_ranks(self, ranks: Mapping[str, int]) -> None:
        """What a placement's ranks per component must give this config (the plan search checks each candidate)."""
        env_ranks, rollout_ranks = ranks["env"], ranks["rollout"]
        if rollout_ranks > env_ranks:
            raise ValueError(
                f"placement: rollout has {rollout_ranks} ranks but env only {env_ranks}; "
                "each rollout rank serves at least one env rank")
        actor_ranks = ranks["actor"]
        if self.algorithm.minibatch_size < actor_ranks:
            raise ValueError(
                f"algorithm.minibatch_size ({self.algorithm.minibatch_size}) must be at least the "
                f"number of actor ranks ({actor_ranks}): each rank takes a share of every minibatch")
        batch = self.rollout_steps * self.env.num_envs * env_ranks
        if self.algorithm.minibatch_size > batch:
            raise ValueError(
                f"algorithm.minibatch_size ({self.algorithm.minibatch_size}) exceeds the batch of "
                f"{batch} samples (rollout_steps x env.num_envs x env ranks)")

    def placed(self) -> PlacementPlan:
        """The placement resolved against the cluster this config will start (names checked)."""
        layout = expected_layout(self.cluster)
        try:
            return parse_placement(self.placement, layout or NodeLayout((SYNTAX_LAYOUT_DEVICES,)), COMPONENTS)
        except PlacementError as e:
            raise ValueError(f"placement: {e}") from None

    def batch_size(self, env_ranks: int) -> int:
        """Samples per iteration: T x envs per rank x env ranks."""
        return self.rollout_steps * self.env.num_envs * env_ranks

    def iterations(self, env_ranks: int) -> int:
        """Iterations needed to reach ``total_env_steps``, counting ``policy.vla.chunk`` env steps per decision
        (an episode ending inside a chunk cuts it short, so a run with chunks may take a few steps fewer)."""
        per = self.batch_size(env_ranks) * self.policy.action_chunk
        return -(-self.total_env_steps // per)
