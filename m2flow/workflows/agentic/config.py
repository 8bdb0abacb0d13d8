"""The config of the agentic RL workflow (``workflow: agentic``): model, environments, rollout, actor, run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from m2flow.config.schema import option
from m2flow.driver.run_config import RunConfig, is_auto
from m2flow.rewards.tools.calls import CALL_STOP
from m2flow.runtime.cluster import expected_layout
from m2flow.runtime.placement import SYNTAX_LAYOUT_DEVICES, NodeLayout, PlacementError, parse_placement
from m2flow.workers.config import ActorConfig, AlgorithmConfig, DType
from m2flow.workflows.agentic.graph import COMPONENTS

@dataclass
class TinyModelSpec:
    """A tiny random causal LM and its tokenizer, built at ``model.path``."""

    tokenizer: Literal["char", "byte"] = option(
        "char", "'char': a token per character of the task's text (the shipped environments' alphabet; for any "
                "other, every printable ASCII character too); 'byte': a token per byte (any text, any language)")

    hidden_size: int = option(64, "width of the residual stream")
    num_layers: int = option(2, "transformer blocks")
    num_heads: int = option(4, "attention heads")
    num_kv_heads: int = option(2, "key/value heads")
    intermediate_size: int = option(128, "MLP width")
    max_position_embeddings: int = option(512, "longest prompt + response")
    seed: int = option(0, "seed of the random initialisation")


@dataclass
class WarmStartConfig:
    """Supervised steps on demonstrations of the task, by a registered teacher (``calculator``: the tool's
    call format; ``guess_number``: bisection; your own: ``register_teacher``) or from a JSONL file, once,
    before the workers start (saved in run_dir/warm_start, reused while its settings match)."""

    steps: int = option(0, "supervised steps (0: none)")
    teacher: str | None = option(
        None, "registered teacher that writes the demonstrations (None: the one named like the environment)")
    teacher_kwargs: dict[str, Any] = option({}, "settings of a teacher of your own (TeachRequest.options)")
    demonstrations: str | None = option(
        None, "JSONL file of your own demonstrations, one episode a line: {\"prompt\": ..., \"turns\": [model "
              "turn, observation, ..., model turn]}; used instead of a teacher")
    batch_size: int = option(32, "demonstrations per step")
    lr: float = option(3e-3, "AdamW learning rate after the warm-up")
    warmup_steps: int = option(0, "steps over which the learning rate rises linearly from 0")
    skip_rate: float = option(0.2, "calculator: share of the teacher's demonstrations that skip the tool and guess")
    copy_error_rate: float = option(0.1, "calculator: share that call the tool and copy its result wrong")
    digits: int = option(3, "calculator: digits of each operand in the demonstrations")
    mistake_rate: float = option(
        0.4, "guess_number: share of the teacher's turns that guess a random other number instead of bisecting")
    threads: int = option(0, "torch threads of the warm start, which runs in the driver (0: torch's default)")

    def validate(self) -> None:
        for key in ("steps", "warmup_steps", "threads"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not (0 <= self.skip_rate and 0 <= self.copy_error_rate and self.skip_rate + self.copy_error_rate <= 1):
            raise ValueError("skip_rate and copy_error_rate must be >= 0 with a sum <= 1")
        if not 0 <= self.mistake_rate <= 1:
            raise ValueError(f"mistake_rate must be in [0, 1], got {self.mistake_rate}")


@dataclass
class ModelConfig:
    """The policy model."""

    path: str = option("runs/models/tiny-agentic", "local Hugging Face model directory (model + tokenizer)")
    create_tiny: bool = option(False, "build a tiny random model at path first when the directory does not exist")
    tiny: TinyModelSpec = option(TinyModelSpec(), "shape of the tiny model built by create_tiny")
    warm_start: WarmStartConfig = option(WarmStartConfig(), "supervised warm start on demonstrations of the task")


@dataclass
class EnvConfig:
    """The text environments and the env workers that hold them."""

    name: str = option("calculator", "registered text environment (calculator, guess_number, gem, reasoning_gym ...)")
    kwargs: dict[str, Any] = option({}, "the environment's own settings")
    imports: list[str] = option(
        [], "modules imported first, in the driver and in every worker that builds environments (where an "
            "environment of your own registers itself with register_text_env)")
    eval_kwargs: dict[str, Any] = option(
        {"split": "test"}, "settings of the held-out environments, over kwargs (a setting the env lacks fails)")
    step_timeout_s: float | None = option(10.0, "a reset or step that gives nothing for this long ends its episode")
    max_error_rate: float = option(
        0.05, "failed environment calls (raised, hung, bad value) tolerated per iteration, as a share of calls; "
              "more stop the run with one error line")
    concurrent: bool = option(False, "step a worker's environments side by side, a thread each (tools with latency)")
    async_steps: bool = option(
        False, "with concurrent and env workers apart: a round of the turn loop takes the answers that have come "
               "and goes on with those episodes while the others' steps are still out, instead of waiting for the "
               "slowest answer (tools with a long-tailed latency)")
    worker_timeout_s: float | None = option(
        60.0, "an env worker that gives no answer for this long is restarted alone (None: wait for ever)")
    max_worker_restarts: int = option(
        4, "env-worker restarts per run; one more ends the attempt like any other dead worker")
    num_threads: int = option(1, "torch threads of each env worker")
    fuse_with_rollout: bool = option(
        False, "when env and rollout ranks sit on the same devices rank for rank, hold the environments in the "
               "rollout's processes (no messages, but a failing environment process then takes the rollout along)")

    def validate(self) -> None:
        if self.step_timeout_s is not None and self.step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0 or None, got {self.step_timeout_s}")
        if self.worker_timeout_s is not None and self.worker_timeout_s <= 0:
            raise ValueError(f"worker_timeout_s must be > 0 or None, got {self.worker_timeout_s}")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ValueError(f"max_error_rate must be in [0, 1], got {self.max_error_rate}")
        if self.max_worker_restarts < 0:
            raise ValueError(f"max_worker_restarts must be >= 0, got {self.max_worker_restarts}")
        if self.async_steps and not self.concurrent:
            raise ValueError("async_steps needs concurrent: true (the steps left out run in threads of their own)")
        if self.async_steps and self.step_timeout_s is None:
            raise ValueError("async_steps needs a step_timeout_s (a step left out is given up on after it)")
        import importlib

        from m2flow.envs.text import text_env_names

        for module in self.imports:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ValueError(f"imports: cannot import {module!r}: {e}") from None
        if self.name not in text_env_names():
            raise ValueError(f"unknown environment {self.name!r}; registered: {', '.join(text_env_names())}")


@dataclass
class RolloutConfig:
    """The rollout workers: model turns of multi-turn episodes."""

    backend: str = option("lean", "generation backend: 'hf', 'lean' (small Qwen2/Llama on a CPU) or 'vllm' (CUDA)")
    dtype: DType = option("float32", "weight dtype of the generation model")
    num_threads: int = option(1, "torch threads of each rollout rank")
    compile: bool = option(
        False, "lean backend: run each decoding step torch.compile'd (one compile per process, ~5-20 s on a "
               "CPU, in the first iteration; then faster steps for small models; eager with a warning if "
               "compiling fails)")
    reuse_kv: bool = option(
        True, "lean backend: keep each episode's KV cache from one turn to the next, so a turn runs only the "
              "tokens added since the last (the same tokens as running the whole context, to float rounding)")
    max_turns: int = option(4, "most model turns per episode (the turn budget)")
    max_tokens: int = option(128, "most response tokens per episode, model and observation together (token budget)")
    max_turn_tokens: int = option(32, "most tokens one model turn may generate")
    temperature: float = option(1.0, "sampling temperature (0: greedy); log-probs are taken at it too")
    eval_temperature: float = option(0.0, "sampling temperature of the held-out evaluation (0: greedy)")
    top_p: float = option(1.0, "nucleus sampling threshold (1.0: off)")
    top_k: int = option(0, "keep only the k most likely tokens (0: off)")
    stop: list[str] = option([CALL_STOP], "strings that end a model turn (the tool call's closing tag; with "
                                          "tool_format hermes: [] or ['</tool_call>'])")
    tool_format: str = option(
        "tag", "how the model calls tools: 'tag' (<tool>NAME: ARG</tool>, plain-text prompts) or 'hermes' "
               "(<tool_call>{json}</tool_call>, prompt and tool results rendered by the tokenizer's chat template "
               "with the tools as function schemas)")
    prompt_template: str = option("{observation}", "how the first observation becomes the prompt")
    observation_template: str = option("{observation}", "how a later observation is written into the context")
    partial: bool = option(
        False, "partial rollouts: an iteration trains on the groups whose episodes finished first; the episodes "
               "still running keep their context, tokens and environment and go on in the next iteration under "
               "the new weights, each token with the version it was sampled under (needs "
               "algorithm.max_staleness >= 1 and old_logprobs 'rollout'; the first iteration "
               "takes one extra batch of groups; a checkpoint holds the carried task instances, which a resumed "
               "run plays again from their resets)")

    def validate(self) -> None:
        for key in ("max_turns", "max_tokens", "max_turn_tokens", "num_threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.temperature < 0 or self.eval_temperature < 0:
            raise ValueError("temperature and eval_temperature must be >= 0")
        for key in ("prompt_template", "observation_template"):
            if "{observation}" not in getattr(self, key):
                raise ValueError(f"{key} must contain '{{observation}}'")
        from m2flow.rewards.tools.formats import CALL_FORMATS

        if self.tool_format not in CALL_FORMATS:
            raise ValueError(f"tool_format: unknown {self.tool_format!r}; valid: {', '.join(CALL_FORMATS.names())}")
        if self.tool_format != "tag" and CALL_STOP in self.stop:
            raise ValueError(f"stop holds {CALL_STOP!r}, the tag format's call end; with tool_format "
                             f"{self.tool_format!r} set stop: [] (a turn ends at the end-of-turn token) or "
                             f"{list(CALL_FORMATS.get(self.tool_format).stop)}")
        from m2flow.backends.generation import check_compile

        check_compile(self.backend, self.compile)  # an unknown backend name raises, listing the valid ones


@dataclass
class EpisodesConfig:
    """The episodes of an iteration: GRPO groups of episodes reset with the same seed."""

    groups_per_step: int = option(8, "groups (seeds) per iteration")
    group_size: int = option(4, "episodes per group, reset with the same seed (GRPO's n)")
    seed_offset: int = option(0, "training seeds are seed_offset + a running count (held-out ones lie apart)")

    def validate(self) -> None:
        if self.groups_per_step < 1 or self.group_size < 1:
            raise ValueError("groups_per_step and group_size must be >= 1")


@dataclass
class AgenticConfig(RunConfig):
    """Agentic RL: a language model acting over several turns in text environments and with tools."""

    placement: str = option(
        "env,rollout,actor: 0",
        "devices of each component (env, rollout, actor); shared devices are taken in turn; 'local': one rank "
        "each, all in this process (no Ray); 'auto': the planner chooses (see auto)")
    run_dir: str = option("runs/agentic", "where logs, metrics, checkpoints and the trace go")
    model: ModelConfig = option(ModelConfig(), "the policy model")
    env: EnvConfig = option(EnvConfig(), "environments and env workers")
    episodes: EpisodesConfig = option(EpisodesConfig(), "episodes per iteration")
    rollout: RolloutConfig = option(RolloutConfig(), "multi-turn generation")
    actor: ActorConfig = option(ActorConfig(), "policy updates")
    algorithm: AlgorithmConfig = option(AlgorithmConfig(old_logprobs="rollout"), "advantages and losses")
    steps: int = option(20, "training iterations")
    eval_episodes: int = option(64, "held-out episodes per evaluation (greedy)")

    def validate(self) -> None:
        super().validate()
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.eval_episodes < 1:
            raise ValueError(f"eval_episodes must be >= 1, got {self.eval_episodes}")
        algo = self.algorithm
        if algo.old_logprobs == "inference":
            raise ValueError("algorithm.old_logprobs: the agentic workflow has no inference component; use "
                             "'rollout' (the generator's log-probs) or 'actor'")
        if algo.needs_reference:
            raise ValueError("algorithm: a reference model (kl_loss_coef / kl_reward_coef > 0) is not supported "
                             "by the agentic workflow")
        if (algo.old_logprobs == "actor" or algo.max_staleness > 0) and not self.actor.updates_once:
            raise ValueError("algorithm.old_logprobs 'actor' and max_staleness > 0 need one optimizer step per "
                             "iteration (actor.mini_batches = actor.update_epochs = 1)")
        if self.rollout.partial and (algo.max_staleness < 1 or algo.old_logprobs != "rollout"):
            raise ValueError(
                "rollout.partial: a carried episode's tokens are trained an iteration after they were sampled: it "
                "needs algorithm.max_staleness >= 1 and algorithm.old_logprobs 'rollout' (each token's own log-prob) "
                f"(got max_staleness {algo.max_staleness}, old_logprobs {algo.old_logprobs!r})")
        ws = self.model.warm_start
        if ws.steps and ws.demonstrations is None:
            # After env.imports: a teacher of your own registers itself in one of those modules.
            from m2flow.data.teachers import TEACHERS

            if ws.teacher is not None and ws.teacher not in TEACHERS:
                raise ValueError(f"model.warm_start.teacher: unknown teacher {ws.teacher!r}; teachers: "
                                 f"{', '.join(TEACHERS)}")
            if ws.teacher is None and self.env.name not in TEACHERS:
                raise ValueError(f"model.warm_start: no teacher demonstrates {self.env.name!r}; teachers: "
                                 f"{', '.join(TEACHERS)} (name one with model.warm_start.teacher, or give a file "
                                 "with model.warm_start.demonstrations)")
        if is_auto(self.placement):
            return
        layout = expected_layout(self.cluster) or NodeLayout((SYNTAX_LAYOUT_DEVICES,))
        try:
            parse_placement(self.placement, layout, COMPONENTS)
        except PlacementError as e:
            raise ValueError(f"placement: {e}") from None

