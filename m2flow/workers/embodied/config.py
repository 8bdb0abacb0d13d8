"""Config sections of the embodied workers: env, rollout and actor ranks, and the PPO algorithm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from m2flow.config.schema import option
from m2flow.workers.config import HOST_SUM_HELP


@dataclass
class PPOConfig:
    """PPO with GAE (Schulman et al. 2017); defaults are Stable-Baselines3's PPO defaults."""

    gamma: float = option(0.99, "discount")
    gae_lambda: float = option(0.95, "GAE lambda")
    clip: float = option(0.2, "PPO ratio clip: ratios leave [1 - clip, 1 + clip] without gradient")
    epochs: int = option(10, "passes over each iteration's batch")
    minibatch_size: int = option(64, "samples per gradient step, over all actor ranks together")
    lr: float = option(3e-4, "Adam learning rate")
    lr_schedule: Literal["constant", "linear"] = option(
        "constant", "'constant', or 'linear' decay to 0 over the run")
    adam_eps: float = option(1e-5, "Adam epsilon")
    ent_coef: float = option(0.0, "entropy bonus weight")
    vf_coef: float = option(0.5, "value loss weight")
    value_clip: float | None = option(None, "clip value updates to +-this around the old values (None: off)")
    max_grad_norm: float = option(0.5, "clip the global gradient norm to this (0: off)")
    normalize_advantages: bool = option(True, "whiten advantages within each minibatch")
    target_kl: float | None = option(None, "stop an iteration's epochs once approx KL passes this (None: off)")
    use_critic: bool = option(
        True, "learn a value function for GAE; false: advantages are Monte-Carlo returns (no value loss)")
    advantage: Literal["gae", "grpo"] = option(
        "gae", "gae: GAE over the critic's values (discounted returns without a critic); grpo: every env "
               "plays one episode per iteration from a reset it shares with the other envs of its group "
               "(group_size), and every step of the episode gets the episode's return standardised within the "
               "group (no critic; steps after the episode's end are left out)")
    group_size: int = option(4, "grpo: envs per group, reset with the same seed at the start of every iteration")
    max_staleness: int = option(
        0, "s: env ranks may collect up to s iterations ahead of the actor with older weights "
        "(decoupled PPO against the behaviour policy); 0: synchronous")
    critic_warmup: int = option(
        0, "iterations at the start in which only the critic's own parameters learn, on the value loss alone "
        "(the policy acts and stays as it was: a critic for a warm-started policy before its first policy step)")
    critic_warmup_lr: float | None = option(None, "Adam learning rate during critic_warmup (None: lr)")

    def validate(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if self.clip <= 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1, got {self.minibatch_size}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_grad_norm < 0:
            raise ValueError(f"max_grad_norm must be >= 0, got {self.max_grad_norm}")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ValueError(f"value_clip must be > 0 or None, got {self.value_clip}")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ValueError(f"target_kl must be > 0 or None, got {self.target_kl}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.critic_warmup < 0:
            raise ValueError(f"critic_warmup must be >= 0, got {self.critic_warmup}")
        if self.critic_warmup and not self.use_critic:
            raise ValueError("critic_warmup trains the critic: it needs use_critic: true")
        if self.critic_warmup_lr is not None and self.critic_warmup_lr <= 0:
            raise ValueError(f"critic_warmup_lr must be > 0 or None, got {self.critic_warmup_lr}")
        if self.advantage == "grpo":
            if self.group_size < 2:
                raise ValueError(f"group_size must be >= 2 for advantage 'grpo', got {self.group_size}")
            if self.use_critic:
                raise ValueError("advantage 'grpo' learns no value function: set use_critic: false")


@dataclass
class EnvWorkerConfig:
    """The env worker ranks (the simulators)."""

    num_threads: int = option(1, "torch / BLAS threads of each env rank (also runs the policy when fused)")
    sync_normalization: bool = option(
        True, "merge observation / reward statistics across env ranks after every iteration")
    imports: list[str] = option(
        [], "modules every env rank imports first, e.g. one registering a custom gymnasium id")
    max_error_rate: float = option(
        0.1, "most exceptions from env step/reset per iteration and env rank, as a fraction of its env steps, "
             "before the run stops with an error naming the env id (each failing env is reset and counted)")

    def validate(self) -> None:
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ValueError(f"max_error_rate must lie in [0, 1], got {self.max_error_rate}")


@dataclass
class RolloutConfig:
    """The rollout worker ranks (policy inference on every env step)."""

    num_threads: int = option(1, "torch threads of each rollout rank")
    fuse_with_env: bool = option(
        True, "when env and rollout ranks sit on the same devices, run the policy inside the env process")
    offload: bool = option(False, "offload the policy copy after each rollout when it shares devices with the actor")

    def validate(self) -> None:
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")


@dataclass
class ActorConfig:
    """The actor ranks (PPO updates, data-parallel with torch.distributed)."""

    num_threads: int = option(1, "torch threads of each actor rank")
    offload: bool = option(
        False, "offload weights and optimizer state after each update when sharing devices with the rollout")
    backend: Literal["auto", "gloo", "nccl"] = option(
        "auto", "torch.distributed backend of the gradient all-reduce: auto (NCCL on GPU, else gloo)")
    host_sum: Literal["auto", "comm", "gloo"] = option("auto", HOST_SUM_HELP)
    compile: bool = option(
        False, "run each PPO minibatch step torch.compile'd (MLP policies; compiled at start-up, ~3-11 s per "
        "actor rank, then ~1.5x faster updates on CPU)")
    max_skipped_updates: int = option(
        3, "PPO updates undone in a row for a NaN/inf loss or weight before the run stops with an error")

    def validate(self) -> None:
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_skipped_updates < 1:
            raise ValueError(f"max_skipped_updates must be >= 1, got {self.max_skipped_updates}")
