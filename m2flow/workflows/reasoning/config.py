"""The config of the reasoning RL workflow (``workflow: reasoning``): model, data, workers, algorithm, run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from m2flow.config.schema import option
from m2flow.driver.run_config import RunConfig, is_auto
from m2flow.runtime.cluster import expected_layout
from m2flow.workflows.reasoning.graph import COMPONENTS
from m2flow.runtime.placement import SYNTAX_LAYOUT_DEVICES, NodeLayout, PlacementError, parse_placement
from m2flow.workers.config import (
    ActorConfig,
    AlgorithmConfig,
    InferenceConfig,
    RewardConfig,
    RolloutConfig,
)



@dataclass
class TinyModelSpec:
    """A tiny random causal LM built at ``model.path`` when it does not exist yet (offline runs, tests)."""

    arch: Literal["qwen2", "llama"] = option("qwen2", "architecture")
    hidden_size: int = option(64, "width of the residual stream")
    num_layers: int = option(2, "transformer blocks")
    num_heads: int = option(4, "attention heads")
    num_kv_heads: int = option(2, "key/value heads")
    intermediate_size: int = option(128, "MLP width")
    max_position_embeddings: int = option(1024, "longest prompt + response")
    tokenizer: Literal["char", "bpe"] = option(
        "char", "tokenizer trained on the training data: one token per character, or a small byte-level BPE")
    vocab_size: int = option(512, "BPE vocabulary size (bpe only)")
    seed: int = option(0, "seed of the random initialisation")


@dataclass
class WarmStartConfig:
    """Supervised steps on demonstrations, once, before the workers start (the result goes to run_dir)."""

    steps: int = option(0, "supervised steps (0: no warm start; the workers load model.path as it is)")
    batch_size: int = option(64, "demonstrations per step")
    lr: float = option(1e-3, "AdamW learning rate after the warm-up")
    warmup_steps: int = option(0, "steps over which the learning rate rises linearly from 0")
    source: Literal["answers", "teacher", "file"] = option(
        "answers", "demonstrations: the training split's reference answers (GSM8K: its worked solutions), the "
                   "data's imperfect teacher (arithmetic: forgets carries and borrows at data.arithmetic.teacher_slip_rate; "
                   "running_sums: skips digits that wrap the sum, at data.running_sums.teacher_slip_rate), "
                   "or your own file (see file)")
    file: str | None = option(
        None, "source: file: a JSONL file of {\"prompt\": ..., \"response\": ...} lines; each prompt is formatted as "
              "the rollout formats prompts (data's template / chat template), the loss is on the response only")
    threads: int = option(0, "torch threads of the warm start, which runs in the driver (0: torch's default)")

    def validate(self) -> None:
        for key in ("steps", "warmup_steps", "threads"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.source == "file" and not self.file:
            raise ValueError("file: source 'file' needs a file (a JSONL file of {prompt, response} lines)")
        if self.source != "file" and self.file:
            raise ValueError(f"file: read only with source 'file' (source is {self.source!r})")


@dataclass
class ModelConfig:
    """The policy model."""

    path: str = option("runs/models/tiny-arithmetic", "local Hugging Face model directory (model + tokenizer)")
    create_tiny: bool = option(False, "build a tiny random model at path first when the directory does not exist")
    tiny: TinyModelSpec = option(TinyModelSpec(), "shape of the tiny model built by create_tiny")
    warm_start: WarmStartConfig = option(
        WarmStartConfig(), "supervised warm start of the model at path; saved in run_dir/warm_start, reused when "
                           "its settings match (a resumed run, a rerun)")


@dataclass
class ArithmeticDataConfig:
    """The built-in arithmetic task ('12+7=' -> '19')."""

    digits: int = option(2, "largest number of digits of each operand")
    operators: list[str] = option(["+", "-"], "operators drawn from: any of + - *")
    train_size: int = option(2000, "training problems")
    test_size: int = option(200, "held-out problems (a disjoint split)")
    seed: int = option(0, "seed of the problem draw")
    reverse_answer: bool = option(False, "answers written least significant digit first ('12+9=' -> '12')")
    pad_operands: bool = option(False, "operands written with `digits` digits ('07+12=')")
    teacher_slip_rate: float = option(
        0.0, "share of the teacher's demonstrations (model.warm_start.source: teacher) in which it forgets every "
             "carry and borrow (+ and - only)")

    def validate(self) -> None:
        if not 0.0 <= self.teacher_slip_rate <= 1.0:
            raise ValueError(f"teacher_slip_rate must be in [0, 1], got {self.teacher_slip_rate}")


@dataclass
class RunningSumsDataConfig:
    """The built-in running-sums task ('314' at a fixed width -> '348'): 1..max_steps reasoning steps, a long tail."""

    max_steps: int = option(24, "most digits in a prompt, so most steps (answer tokens) in a response")
    length_tail: float = option(1.0, "P(k digits) proportional to k ** -length_tail (0: uniform; larger: fewer long)")
    train_size: int = option(4000, "training problems (drawn with replacement)")
    test_size: int = option(400, "held-out problems (a disjoint split, drawn with replacement)")
    seed: int = option(0, "seed of the problem draw")
    teacher_slip_rate: float = option(
        0.0, "share of the teacher's demonstrations (model.warm_start.source: teacher) in which it skips every digit "
             "that would take the running sum past 9")

    def validate(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not self.length_tail >= 0.0:
            raise ValueError(f"length_tail must be >= 0, got {self.length_tail}")
        for key in ("train_size", "test_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0.0 <= self.teacher_slip_rate <= 1.0:
            raise ValueError(f"teacher_slip_rate must be in [0, 1], got {self.teacher_slip_rate}")


SYNTHETIC_KINDS = ("arithmetic", "running_sums")
"""The data kinds generated here, each with an imperfect teacher for the warm start."""


@dataclass
class DataConfig:
    """Where prompts and reference answers come from."""

    kind: Literal["arithmetic", "running_sums", "gsm8k", "file"] = option(
        "arithmetic", "arithmetic or running_sums (built in), gsm8k (a directory with train/test jsonl), file (jsonl "
                      "or parquet)")
    path: str | None = option(None, "gsm8k: directory or file; file: the training prompts")
    eval_path: str | None = option(None, "file: held-out prompts (None: no held-out set); gsm8k: the test split of path")
    prompt_key: str = option("prompt", "file: key of the prompt text")
    answer_key: str = option("answer", "file: key of the reference answer")
    prompt_template: str | None = option(None, "wording around each prompt, with {prompt} (gsm8k: its own by default)")
    use_chat_template: bool = option(False, "wrap prompts in the tokenizer's chat template")
    system_prompt: str | None = option(None, "system message of the chat template")
    max_prompt_tokens: int | None = option(None, "drop prompts longer than this")
    on_bad_line: Literal["error", "skip"] = option("error", "a malformed record: fail naming file and line, or skip and count")
    limit: int | None = option(None, "use only the first this-many training records")
    arithmetic: ArithmeticDataConfig = option(ArithmeticDataConfig(), "the arithmetic task (kind: arithmetic)")
    running_sums: RunningSumsDataConfig = option(RunningSumsDataConfig(), "the running-sums task (kind: running_sums)")
    prompts_per_step: int = option(8, "prompts per iteration (each gets rollout.sampling.n responses)")
    shuffle: bool = option(True, "shuffle the prompts every epoch")

    def validate(self) -> None:
        if self.kind in ("gsm8k", "file") and not self.path:
            raise ValueError(f"path is required for kind {self.kind!r}")
        if self.prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {self.prompts_per_step}")


@dataclass
class ReasoningConfig(RunConfig):
    """Reasoning RL on a causal language model: GRPO, PPO, DAPO, REINFORCE++, RLOO."""

    placement: str = option(
        "actor,rollout,inference,reward: 0",
        "devices of each component (rollout, reward, inference, actor); shared devices are taken in turn; "
        "'local': one rank each, all in this process (no Ray); 'auto': the planner chooses (see auto)")
    run_dir: str = option("runs/reasoning", "where logs, metrics, checkpoints and the trace go")
    model: ModelConfig = option(ModelConfig(), "the policy model")
    data: DataConfig = option(DataConfig(), "prompts and answers")
    rollout: RolloutConfig = option(RolloutConfig(), "generation")
    reward: RewardConfig = option(RewardConfig(), "scoring")
    inference: InferenceConfig = option(InferenceConfig(), "old-policy and reference log-probs")
    actor: ActorConfig = option(ActorConfig(), "policy updates")
    algorithm: AlgorithmConfig = option(AlgorithmConfig(), "advantages, losses, KL, DAPO options")
    steps: int = option(20, "training iterations")
    eval_size: int | None = option(None, "held-out prompts evaluated (None: all)")
    eval_reward: str | None = option(
        None, "reward that scores the held-out evaluation, when it must differ from the training one (None: reward.fn)")

    def validate(self) -> None:
        super().validate()
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.algorithm.old_logprobs == "actor" and not self.actor.updates_once:
            raise ValueError(
                "algorithm.old_logprobs: 'actor' is exact only with one optimizer step per iteration "
                "(actor.mini_batches = actor.update_epochs = 1)")
        if self.model.warm_start.source == "teacher" and self.data.kind not in SYNTHETIC_KINDS:
            raise ValueError(f"model.warm_start.source: 'teacher' needs data.kind in {list(SYNTHETIC_KINDS)}, got "
                             f"{self.data.kind!r}")
        if self.algorithm.max_staleness > 0 and not self.actor.updates_once:
            raise ValueError(
                "algorithm.max_staleness > 0 needs one optimizer step per iteration (actor.mini_batches = "
                "actor.update_epochs = 1): the proximal policy is then the actor's own forward")
        if self.rollout.partial and (self.algorithm.max_staleness < 1 or self.algorithm.old_logprobs != "rollout"):
            raise ValueError(
                "rollout.partial: a carried response's tokens are trained a step after they were sampled: it needs "
                "algorithm.max_staleness >= 1 and algorithm.old_logprobs 'rollout' (each token's own log-prob)")
        if self.rollout.inflight_updates and not self.rollout.partial:
            raise ValueError("rollout.inflight_updates: the versions of weights loaded while generating are recorded "
                             "per token by partial rollouts: it needs rollout.partial")
        if is_auto(self.placement):  # the planner checks each plan it considers
            return
        # Attaching to a cluster, its devices are unknown until connected: check the syntax only.
        layout = expected_layout(self.cluster) or NodeLayout((SYNTAX_LAYOUT_DEVICES,))
        try:
            plan = parse_placement(self.placement, layout, COMPONENTS)
        except PlacementError as e:
            raise ValueError(f"placement: {e}") from None
        self.check_ranks({c: plan[c].world_size for c in COMPONENTS})

    def check_ranks(self, ranks: Mapping[str, int]) -> None:
        """What a placement's ranks per component must give this config (the plan search checks each candidate)."""
        from m2flow.backends.training.registry import strategy_traits

        actor_ranks = ranks["actor"]
        if strategy_traits(self.actor.strategy).sharded and self.data.prompts_per_step < actor_ranks:
            raise ValueError(
                f"data.prompts_per_step ({self.data.prompts_per_step}) must be at least the number of "
                f"actor ranks ({actor_ranks}) with a sharded actor.strategy (fsdp)")
