"""Config sections of the reasoning workers: rollout, reward, inference, actor (+ critic), algorithm."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from m2flow.backends.training.optim import OptimConfig
from m2flow.config.schema import option

DType = Literal["float32", "bfloat16", "float16"]
OldLogprobSource = Literal["inference", "rollout", "actor"]
Batching = Literal["auto", "continuous", "chunked"]

# Estimators whose advantage of a response depends only on its own group: the actor may train on
# groups as they arrive instead of waiting for the whole batch.
GROUP_LOCAL_ESTIMATORS = frozenset({"grpo", "dr_grpo", "rloo"})


EXCHANGE_MAX_RANKS = 4
"""``host_sum: auto`` sums with ``m2flow.runtime.comm.collectives.ExchangeSum`` in CPU groups of at most
this many ranks, with gloo in larger ones."""

HOST_SUM_HELP = ("how CPU ranks sum gradients and counts: 'comm' sends each rank's tensor to the others over "
                 "the communicator (shared memory on one node), 'gloo' a gloo all-reduce; 'auto': comm for "
                 f"up to {EXCHANGE_MAX_RANKS} ranks, else gloo (GPU ranks use the device backend whatever the setting)")


def uses_exchange(mode: str, world_size: int, device_type: str) -> bool:
    """Whether ``host_sum`` ``mode`` ('auto', 'comm', 'gloo') picks ``ExchangeSum`` for this group."""
    if mode not in ("auto", "comm", "gloo"):
        raise ValueError(f"host_sum must be 'auto', 'comm' or 'gloo', got {mode!r}")
    if world_size < 2 or mode == "gloo" or device_type != "cpu":
        return False
    return mode == "comm" or world_size <= EXCHANGE_MAX_RANKS


@dataclass
class SamplingConfig:
    """How responses are sampled."""

    n: int = option(4, "responses sampled per prompt (the group size)")
    temperature: float = option(1.0, "sampling temperature (0: greedy); log-probs are taken at it too")
    top_p: float = option(1.0, "nucleus sampling threshold (1.0: off)")
    top_k: int = option(0, "keep only the k most likely tokens (0: off)")
    max_new_tokens: int = option(32, "most tokens generated per response")
    stop: list[str] = option([], "strings that end a response")

    def validate(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class RolloutConfig:
    """The rollout workers: generation of n responses per prompt."""

    backend: str = option(
        "hf", "generation backend: 'hf' (CPU or GPU), 'lean' (small Qwen2/Llama models on a CPU) or 'vllm' (CUDA)")
    sampling: SamplingConfig = option(SamplingConfig(), "sampling parameters")
    batching: Batching = option(
        "auto", "'continuous': a running batch of at most max_running responses, each prompt's group sent "
                "downstream the moment its last response ends, waiting prompts taking the freed rows (backends "
                "with continuous batching: lean); 'chunked': prompts_per_chunk prompts per generate call, a "
                "chunk's groups sent when it ends; 'auto': continuous where the backend has it and "
                "prompts_per_chunk is unset, else chunked")
    max_running: int = option(
        256, "continuous batching: most responses decoded at once (at least sampling.n: a group starts whole)")
    prompts_per_chunk: int | None = option(
        None, "chunked batching: prompts per generate call; a chunk's groups go downstream as soon as it ends "
              "(None: all at once)")
    dtype: DType = option("float32", "weight dtype of the generation model")
    num_threads: int = option(1, "torch threads of each rollout rank")
    compile: bool = option(
        False, "lean backend: run each decoding step torch.compile'd (one compile per process, ~5-20 s on a "
               "CPU; then faster steps for small models, 1.3-1.5x in G1; eager with a warning if compiling fails)")
    partial: bool = option(
        False, "partial rollouts: a step trains on the groups that finish first; the responses still generating "
               "keep their tokens and continue in the next step under the new weights, each token with the "
               "version and log-prob it was sampled with (continuous batching; needs algorithm.max_staleness >= 1 "
               "and old_logprobs 'rollout'; the first step of a run takes one extra batch of prompts; a checkpoint "
               "holds the prompts still carried, with their rows, and a resumed run goes on with them)")
    inflight_updates: bool = option(
        False, "partial rollouts: weights the actor sends while a rollout rank generates are loaded between "
               "decoding steps, the rows going on under them, each token recording the version it was sampled "
               "with (instead of waiting for the generation's end); a run is then no longer reproducible "
               "token for token (when weights land depends on timing); weights land only where generation "
               "overlaps training: max_staleness >= 2 and the rollout on devices of its own; needs rollout.partial")
    fuse_with_actor: bool = option(
        True, "when rollout and actor ranks sit on the same devices rank for rank (ddp actor, hf or lean backend, "
              "same dtype), generate inside the actor processes from the trained policy itself: no weight "
              "sync, no second copy of the model (the actor's num_threads apply)")

    def validate(self) -> None:
        if self.prompts_per_chunk is not None and self.prompts_per_chunk < 1:
            raise ValueError(f"prompts_per_chunk must be >= 1 or None, got {self.prompts_per_chunk}")
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        # What a backend accepts is the backend's to say: its declared traits, read without importing it.
        from m2flow.backends.generation.factory import check_compile
        from m2flow.backends.generation.registry import GENERATION_BACKENDS, generation_backend_traits

        backend = generation_backend_traits(self.backend)  # an unknown name raises, listing the valid ones
        if self.batching not in ("auto", "continuous", "chunked"):
            raise ValueError(f"batching must be 'auto', 'continuous' or 'chunked', got {self.batching!r}")
        if self.max_running < self.sampling.n:
            raise ValueError(f"max_running ({self.max_running}) must be >= sampling.n ({self.sampling.n}): "
                             "a group's responses start together")
        if self.batching == "continuous":
            if not backend.continuous:
                streaming = sorted(n for n in GENERATION_BACKENDS if generation_backend_traits(n).continuous)
                raise ValueError(f"batching 'continuous' needs a backend with continuous batching "
                                 f"({', '.join(streaming)}), not {self.backend!r}")
            if self.prompts_per_chunk is not None:
                raise ValueError("prompts_per_chunk applies to batching 'chunked', not 'continuous'")
        if self.partial and (self.batching == "chunked" or not backend.continuous or self.prompts_per_chunk is not None):
            raise ValueError("partial: partial rollouts need continuous batching (a backend that has it, "
                             "batching 'continuous' or 'auto', no prompts_per_chunk)")
        check_compile(self.backend, self.compile)


_CONFIGURED: Any = object()


def batching_mode(cfg: RolloutConfig, prompts_per_chunk: int | None = _CONFIGURED) -> Literal["continuous", "chunked"]:
    """How a rollout rank batches its prompts under ``cfg`` (``batching: auto`` resolved), with
    ``prompts_per_chunk`` (a plan's choice) in place of the config's when given."""
    if cfg.batching != "auto":
        return cfg.batching  # type: ignore[return-value]
    from m2flow.backends.generation.registry import generation_backend_traits

    chunk = cfg.prompts_per_chunk if prompts_per_chunk is _CONFIGURED else prompts_per_chunk
    streams = generation_backend_traits(cfg.backend).continuous and chunk is None
    return "continuous" if streams else "chunked"


@dataclass
class RewardConfig:
    """The reward workers: score each response against its reference answer."""

    fn: str = option("math", "reward: a registered name (math, format) or 'module:function'")
    timeout_s: float = option(
        5.0, "time limit of one sandboxed check (of a whole batch for a batched reward); a timeout scores 0 and "
             "is counted")
    isolate: bool = option(
        True, "run every check in the sandbox pool (time limit, crash isolation); false scores in the worker's "
              "own process: fastest for a cheap reward you trust, but a check that hangs or crashes takes its "
              "worker with it (the run's iteration deadline and restarts are what recover)")
    max_error_rate: float = option(
        0.1, "most failed checks (timeouts, errors, crashes, NaN/inf) per iteration and reward rank, as a fraction "
             "of its checks, before the run stops with an error (1.0: never stop)")
    overlong_buffer: int | None = option(
        None, "DAPO overlong shaping: the penalty ramps up over the last this-many tokens before max_new_tokens")
    overlong_penalty: float = option(1.0, "the overlong penalty at max_new_tokens")
    num_threads: int = option(1, "torch threads of each reward rank")
    fuse_with_rollout: bool = option(
        True, "when reward and rollout ranks sit on the same devices, score in the rollout process: no reward "
              "workers, and each group goes from generation to the next stage in one hop")

    def validate(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ValueError(f"max_error_rate must lie in [0, 1], got {self.max_error_rate}")
        if self.overlong_buffer is not None and self.overlong_buffer < 1:
            raise ValueError(f"overlong_buffer must be >= 1 or None, got {self.overlong_buffer}")
        from m2flow.algorithms.registry import UnknownNameError
        from m2flow.rewards.registry import RewardLoadError, load_reward_fn

        try:  # with the rest of the config, before any model is built or worker started
            load_reward_fn(self.fn)
        except (UnknownNameError, RewardLoadError) as e:
            raise ValueError(f"fn: {e}") from None


@dataclass
class InferenceConfig:
    """The inference workers: old-policy and reference log-probs."""

    micro_batch_size: int = option(32, "most responses per forward pass; fewer when fewer are ready")
    micro_batch_tokens: int | None = option(
        None, "most tokens (real prompt + response tokens of its rows) per forward pass, whole groups, in place "
              "of micro_batch_size (a group above it goes alone; None: micro_batch_size counts responses)")
    dtype: DType = option("float32", "weight dtype of the policy and reference copies")
    num_threads: int = option(1, "torch threads of each inference rank")
    forward: Literal["hf", "packed"] = option(
        "hf", "the forward of the policy and reference copies: the HF model's ('hf'), or the packed functional "
              "one ('packed', formerly 'lean': Qwen2/Llama; each prompt run once per micro-batch, no padding "
              "inside a group)")

    def validate(self) -> None:
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        _check_tokens(self.micro_batch_tokens)


@dataclass
class AlgorithmConfig:
    """The RL algorithm: advantages, policy loss, KL and DAPO's data-side pieces."""

    adv_estimator: str = option(
        "grpo", "advantage estimator: grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae (PPO, with a critic)")
    norm_adv_by_std: bool = option(True, "GRPO: divide by the group's std (False: Dr. GRPO's r - mean)")
    gamma: float = option(1.0, "discount over response tokens (gae, reinforce_pp)")
    lam: float = option(1.0, "GAE lambda")
    policy_loss: str = option(
        "ppo", "policy loss: ppo (clipped surrogate), vanilla, or decoupled_ppo (clipped against the proximal "
        "policy, each token weighted by pi_prox / pi_behav: tokens of mixed weight versions)")
    clip_low: float = option(0.2, "PPO ratio clip below 1")
    clip_high: float | None = option(None, "PPO ratio clip above 1 (DAPO clip-higher; None: clip_low)")
    clip_c: float | None = option(None, "dual-clip constant (> 1) for negative advantages (None: off)")
    loss_agg: str = option(
        "token-mean", "loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm")
    kl_loss_coef: float = option(0.0, "weight of a KL(policy || reference) loss term (0: off)")
    kl_loss_kind: str = option("k3", "KL estimator of the loss term: k1, k2, k3")
    kl_reward_coef: float = option(0.0, "KL penalty folded into token rewards (gae, reinforce_pp; 0: off)")
    kl_reward_kind: str = option("k1", "KL estimator of the reward penalty")
    entropy_coef: float = option(0.0, "entropy bonus weight (0: off)")
    dynamic_sampling: bool = option(False, "DAPO: drop groups whose rewards are all equal (they carry no signal)")
    old_logprobs: OldLogprobSource = option(
        "inference",
        "behaviour log-probs: recomputed by inference, as reported by rollout, or the actor's own "
        "detached forward ('actor': exact when each iteration makes one optimizer step)")
    behaviour_weight_cap: float | None = option(
        None, "decoupled_ppo: truncate each token's pi_prox / pi_behav weight at this value (None: no cap)")
    max_staleness: int = option(
        0, "s: the rollout may generate up to s iterations ahead of the actor with older weights (decoupled PPO "
        "against the behaviour policy; needs old_logprobs 'inference' or 'rollout'); 0: synchronous")

    @property
    def uses_critic(self) -> bool:
        """True when advantages need a learned value function."""
        return self.adv_estimator == "gae"

    @property
    def needs_reference(self) -> bool:
        """True when reference-policy log-probs are needed."""
        return self.kl_loss_coef > 0 or self.kl_reward_coef > 0

    @property
    def group_local(self) -> bool:
        """True when a group's advantages can be computed from that group alone."""
        return self.adv_estimator in GROUP_LOCAL_ESTIMATORS

    def validate(self) -> None:
        from m2flow.algorithms import ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES

        for key, registry in (("adv_estimator", ADV_ESTIMATORS), ("policy_loss", POLICY_LOSSES),
                              ("loss_agg", LOSS_AGGREGATIONS), ("kl_loss_kind", KL_ESTIMATORS),
                              ("kl_reward_kind", KL_ESTIMATORS)):
            name = getattr(self, key)
            if name not in registry:
                raise ValueError(f"{key}: unknown {registry.kind} {name!r}; valid: {', '.join(registry.names())}")
        for key in ("kl_loss_coef", "kl_reward_coef", "entropy_coef"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.behaviour_weight_cap is not None and self.behaviour_weight_cap <= 0:
            raise ValueError(f"behaviour_weight_cap must be > 0, got {self.behaviour_weight_cap}")
        if self.clip_low <= 0:
            raise ValueError(f"clip_low must be > 0, got {self.clip_low}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.max_staleness > 0 and self.old_logprobs == "actor":
            raise ValueError("max_staleness > 0 needs the behaviour policy's log-probs: old_logprobs 'inference' "
                             "or 'rollout' (the actor's own forward is the proximal policy, not the one that generated)")
        if self.kl_reward_coef > 0 and self.adv_estimator not in ("gae", "reinforce_pp", "reinforce_pp_baseline"):
            raise ValueError(
                f"kl_reward_coef: estimator {self.adv_estimator!r} takes no KL in the reward; "
                "use kl_loss_coef, or gae / reinforce_pp")


@dataclass
class CriticConfig:
    """PPO's value model, trained next to the policy in the actor workers."""

    path: str | None = option(None, "local model directory of the value trunk (None: the policy's)")
    optim: OptimConfig = option(OptimConfig(lr=1e-5), "the critic's optimizer")
    value_clip: float | None = option(0.5, "PPO value clipping around the old values (None: off)")


@dataclass
class ActorConfig:
    """The actor workers: policy updates."""

    strategy: Literal["ddp", "fsdp"] = option("ddp", "data parallelism: replicated weights (ddp) or sharded (fsdp)")
    fsdp_cpu_offload: bool = option(False, "fsdp: keep parameters in host memory between uses")
    optim: OptimConfig = option(OptimConfig(), "the policy's optimizer and learning-rate schedule")
    micro_batch_size: int = option(16, "most responses per forward/backward (gradients accumulate over them)")
    micro_batch_tokens: int | None = option(
        None, "most tokens (real prompt + response tokens of its rows) per forward/backward, in place of "
              "micro_batch_size (streaming: whole groups, a group above it goes alone; gathered: rows; None: "
              "micro_batch_size counts responses)")
    mini_batches: int = option(1, "optimizer steps per iteration (the batch is split into this many)")
    update_epochs: int = option(1, "passes over the iteration's batch")
    dtype: DType = option("float32", "weight dtype of the trained policy")
    weight_sync_bucket_mb: int = option(64, "weight sync to rollout/inference streams buckets of this size")
    critic: CriticConfig = option(CriticConfig(), "the value model (used by the gae estimator)")
    num_threads: int = option(1, "torch threads of each actor rank")
    host_sum: Literal["auto", "comm", "gloo"] = option("auto", HOST_SUM_HELP)
    max_skipped_updates: int = option(
        3, "optimizer steps skipped in a row for a NaN/inf loss or gradient before the run stops with an error")
    forward: Literal["hf", "packed"] = option(
        "hf", "the policy's training forward: the HF model's ('hf'), or the packed functional one over the same "
              "parameters ('packed', formerly 'lean': Qwen2/Llama with strategy ddp; each prompt run once per "
              "micro-batch, no padding inside a group, less per-pass overhead for small models)")

    @property
    def updates_once(self) -> bool:
        """True when each iteration makes exactly one optimizer step."""
        return self.mini_batches == 1 and self.update_epochs == 1

    def validate(self) -> None:
        for key in ("micro_batch_size", "mini_batches", "update_epochs", "weight_sync_bucket_mb", "num_threads",
                    "max_skipped_updates"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        _check_tokens(self.micro_batch_tokens)
        if self.forward == "packed" and self.strategy != "ddp":
            # FSDP2 gathers the shards in the module's forward hooks, which the packed forward skips.
            raise ValueError(f"forward 'packed' needs strategy 'ddp', got {self.strategy!r}")


def _check_tokens(budget: int | None) -> None:
    if budget is not None and budget < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1 or None, got {budget}")


def torch_dtype(name: DType):  # -> torch.dtype; torch is imported lazily to keep this module light
    """The torch dtype named ``name``."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def plan_micro_batches(plan_settings: Mapping[str, Any], name: str, section: Any) -> dict[str, Any]:
    """The micro-batch sizes of consumer ``name`` (``actor``, ``inference``) as a plan's settings record them:
    by tokens when the plan set a token budget (``<name>_micro_batch_tokens``), else by responses
    (``<name>_micro_batch``); the config ``section``'s size where the plan records none."""
    if f"{name}_micro_batch_tokens" in plan_settings:
        return {"micro_batch_size": section.micro_batch_size,
                "micro_batch_tokens": plan_settings[f"{name}_micro_batch_tokens"]}
    return {"micro_batch_size": plan_settings.get(f"{name}_micro_batch", section.micro_batch_size),
            "micro_batch_tokens": None}
