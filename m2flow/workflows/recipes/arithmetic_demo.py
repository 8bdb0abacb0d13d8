"""The arithmetic demo recipe: a tiny transformer, a warm start on an imperfect teacher, then GRPO.

`ArithmeticDemoRecipe` holds the settings (the one source of the demo's defaults);
`run_local_grpo` is the single-process reference loop: it uses only library pieces (task, tokenizer,
tiny model, supervised steps, HF generation, GRPO advantage, PPO clipped loss) and no Ray.

The story the demo tells: reinforcement learning with a verifier surpasses imperfect
demonstrations. The warm start imitates a teacher who, in `slip_rate` (70%) of its answers, forgets
every carry and borrow ('18+05=' answered 13 instead of 23). Trained on that, the model's most likely
answer to a problem with a carry or borrow is the teacher's mistake, so greedy decoding gets mostly
the problems that need no carry or borrow right (~37% of them), while the right answer keeps about
30% of the probability under sampling. GRPO with the exact-answer reward finds it in most groups of 8 samples and turns it into
the greedy answer. More supervised training on the same teacher cannot do that: it only fits the
teacher's 70/30 mixture better (`arithmetic_study` runs that control).

Why the task is written as it is: answers least significant digit first and operands at a fixed
width ('07+15=' -> '22'), so each answer digit depends only on two operand digits at fixed
positions and the carry just produced. In the earlier form (most significant digit first, free
width) a 4-layer model needed 550 to 900+ supervised steps before accuracy rose at all, at a
seed-dependent step, and GRPO's gain over the warm start varied from +0.09 to +0.00 across seeds.

Model size and warm start: a 2-layer model had not reached that plateau after 600 supervised steps
(greedy held-out accuracy 0.075); a 4-layer, 128-wide one at lr 1e-3 reaches it around step 600
(seed 0: 0.42 held-out, the teacher's mistake as the greedy answer on 82-88% of carry/borrow
problems, some of 8 samples right on 73-78% of problems), so the warm start runs 1,000 steps.
Figures per seed are in docs/benchmarks.md, "Demo: arithmetic GRPO".

Reward: 1.0 when the response is exactly the answer followed by end-of-sequence, else 0.0; with
`digit_credit > 0`, a wrong answer of the right length earns `digit_credit` x (share of its digits
that are right), a small shaping term that is off by default.

Where this deviates from textbook GRPO: no KL term and no reference model (the task is verifiable
and the run short, so nothing needs anchoring), and one optimizer step per rollout batch, so the
PPO ratio is 1 and the clipped loss reduces to the policy gradient (`updates_per_batch > 1` turns
clipping on).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from m2flow.algorithms import TokenBatch, compute_advantages, policy_loss
from m2flow.backends.generation import HFGenerationBackend, SamplingParams
from m2flow.config.schema import option
from m2flow.data.arithmetic import ARITHMETIC_ALPHABET, ArithmeticTask
from m2flow.data.batch import Response, RolloutBatch, left_pad, right_pad
from m2flow.models.causal_lm import response_logprobs
from m2flow.models.tiny import TinyModelConfig, build_tiny_model
from m2flow.models.tokenizer import train_char_tokenizer

log = logging.getLogger(__name__)

SFT_WARMUP_STEPS = 20
"""Supervised steps over which the learning rate rises linearly from 0."""


@dataclass
class ArithmeticDemoRecipe:
    """Settings of the arithmetic demo (task, teacher, model, warm start, GRPO, evaluation)."""

    digits: int = option(2, "largest number of digits of each operand")
    operators: tuple[str, ...] = option(("+", "-"), "operators of the problems")
    reverse_answer: bool = option(True, "answers written least significant digit first")
    pad_operands: bool = option(True, "operands written with `digits` digits ('07+12=')")
    slip_rate: float = option(0.7, "share of warm-start demonstrations in which the teacher forgets every carry and borrow")
    hidden_size: int = option(128, "width of the tiny Qwen2 model")
    num_layers: int = option(4, "transformer blocks")
    num_heads: int = option(4, "attention heads")
    intermediate_size: int = option(256, "MLP width")
    sft_steps: int = option(1000, "supervised warm-start steps on the teacher's demonstrations")
    sft_batch_size: int = option(128, "demonstrations per warm-start step")
    sft_lr: float = option(1e-3, "warm-start learning rate (after a 20-step linear warm-up)")
    grpo_steps: int = option(60, "GRPO steps (one rollout batch each)")
    prompts_per_step: int = option(32, "prompts per rollout batch")
    group_size: int = option(8, "responses sampled per prompt")
    temperature: float = option(1.0, "sampling temperature of the rollouts")
    max_new_tokens: int = option(4, "most tokens per response (the longest answer is 3 digits + end-of-sequence)")
    lr: float = option(3e-4, "GRPO learning rate")
    lr_warmup_steps: int = option(10, "GRPO steps over which the learning rate rises linearly from 0")
    updates_per_batch: int = option(1, "optimizer steps per rollout batch (1 = fully on-policy)")
    clip: float = option(0.2, "PPO clip range (matters only when updates_per_batch > 1)")
    max_grad_norm: float = option(1.0, "gradient-norm clip of each GRPO update (0: off)")
    digit_credit: float = option(0.0, "shaping: share of right digits in a wrong same-length answer, times this")
    eval_size: int = option(400, "held-out problems scored with greedy decoding")
    eval_every: int = option(10, "GRPO steps between held-out evaluations (0: only at the end)")
    threads: int = option(2, "torch intra-op threads (0: leave torch's setting alone)")
    seed: int = option(0, "seed of the model, the data order and the sampling")

    def validate(self) -> None:
        """Fail naming the field when a setting is out of range."""
        for key in ("digits", "hidden_size", "num_layers", "num_heads", "intermediate_size", "sft_batch_size",
                    "grpo_steps", "prompts_per_step", "group_size", "max_new_tokens", "eval_size", "updates_per_batch"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("sft_steps", "lr_warmup_steps", "eval_every", "threads", "max_grad_norm", "digit_credit"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        for key in ("sft_lr", "lr", "temperature"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")
        if not 0.0 <= self.slip_rate <= 1.0:
            raise ValueError(f"slip_rate must be in [0, 1], got {self.slip_rate}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares responses within a group), got {self.group_size}")
        self.task()  # digits and operators

    def task(self) -> ArithmeticTask:
        """The arithmetic task of this recipe."""
        return ArithmeticTask(digits=self.digits, operators=tuple(self.operators),
                             reverse_answer=self.reverse_answer, pad_operands=self.pad_operands)

    def model_config(self) -> TinyModelConfig:
        """The tiny model's shape."""
        return TinyModelConfig(
            arch="qwen2",
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=max(1, self.num_heads // 2),
            intermediate_size=self.intermediate_size,
            max_position_embeddings=64,
            seed=self.seed,
        )


def arithmetic_reward(response: Response, answer: str, digit_credit: float = 0.0) -> float:
    """1.0 for exactly `answer` then end-of-sequence; optional partial credit for digits (see module doc)."""
    text = (response.text or "").strip()
    if response.finish_reason == "stop" and text == answer:
        return 1.0
    if digit_credit and len(text) == len(answer):
        return digit_credit * sum(a == b for a, b in zip(text, answer)) / len(answer)
    return 0.0


@torch.no_grad()
def evaluate(model: PreTrainedModel, tokenizer: Any, problems: Sequence[dict[str, str]], max_new_tokens: int = 4, batch_size: int = 512) -> float:
    """Share of `problems` answered exactly with greedy decoding."""
    backend = HFGenerationBackend(model, tokenizer)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)
    correct = 0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        ids = [tokenizer(p["prompt"], add_special_tokens=False)["input_ids"] for p in chunk]
        for group, p in zip(backend.generate(ids, params), chunk):
            correct += arithmetic_reward(group.responses[0], p["answer"]) == 1.0
    return correct / max(1, len(problems))


@dataclass
class GRPOStats:
    """What one GRPO step did."""

    reward: float
    accuracy: float
    loss: float
    mixed_groups: float
    seconds: float
    tokens: int = 0
    """Response tokens sampled in the step."""


def grpo_step(
    model: PreTrainedModel,
    tokenizer: Any,
    backend: HFGenerationBackend,
    optimizer: torch.optim.Optimizer,
    problems: Sequence[dict[str, str]],
    recipe: ArithmeticDemoRecipe,
    seed: int,
    reward_fn: Callable[[Response, str], float] | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> GRPOStats:
    """Sample a group per problem, score it, and update the model with the clipped GRPO loss."""
    start = time.perf_counter()
    g = recipe.group_size
    reward_fn = reward_fn or (lambda r, a: arithmetic_reward(r, a, recipe.digit_credit))
    prompt_ids = [tokenizer(p["prompt"], add_special_tokens=False)["input_ids"] for p in problems]
    params = SamplingParams(n=g, temperature=recipe.temperature, max_new_tokens=recipe.max_new_tokens, seed=seed)
    model.eval()
    groups = backend.generate(prompt_ids, params)
    batch = RolloutBatch.from_groups(groups, pad_id=tokenizer.pad_token_id)
    scores = torch.tensor([reward_fn(r, p["answer"]) for grp, p in zip(groups, problems) for r in grp.responses])
    exact = torch.tensor([arithmetic_reward(r, p["answer"]) == 1.0 for grp, p in zip(groups, problems) for r in grp.responses])
    adv = compute_advantages("grpo", TokenBatch(response_mask=batch.response_mask, scores=scores), group_size=g)
    per_group = scores.view(-1, g)
    mixed = (per_group.max(1).values > per_group.min(1).values).float().mean()
    loss_value = 0.0
    if bool(mixed > 0):  # all-constant groups have zero advantages: no update at all
        # The HF backend reports the same log-probs the training forward computes, so one update per
        # batch needs no extra pass; more updates need the pre-update policy recomputed.
        old = batch.rollout_logprobs
        if recipe.updates_per_batch > 1:
            with torch.no_grad():
                old, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask, temperature=recipe.temperature)
        model.train()
        for _ in range(recipe.updates_per_batch):
            new, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask, temperature=recipe.temperature)
            out = policy_loss("ppo", new, old, adv.advantages, adv.mask, clip_low=recipe.clip)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            if recipe.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            loss_value = float(out.loss.detach())
        model.eval()
    return GRPOStats(
        reward=float(scores.mean()),
        accuracy=float(exact.float().mean()),
        loss=loss_value,
        mixed_groups=float(mixed),
        seconds=time.perf_counter() - start,
        tokens=int(batch.response_mask.sum()),
    )


@dataclass
class WarmStart:
    """The model after the supervised warm start, and what it took."""

    model: PreTrainedModel
    tokenizer: Any
    steps: int
    seconds: float


@dataclass
class LocalRunResult:
    """Outcome of `run_local_grpo`: held-out accuracy before and after GRPO, and the history."""

    warm_start_accuracy: float
    final_accuracy: float
    warm_start_steps: int
    warm_start_seconds: float
    grpo_seconds: float
    history: list[dict[str, float]] = field(default_factory=list)


def warmup_schedule(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `steps` updates, then constant: Adam's first RL steps are otherwise as large as later ones."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / max(1, steps)))


def build_demo_model(recipe: ArithmeticDemoRecipe) -> tuple[PreTrainedModel, Any]:
    """The random tiny model and the character tokenizer of the task."""
    tokenizer = train_char_tokenizer([ARITHMETIC_ALPHABET])
    return build_tiny_model(recipe.model_config(), tokenizer), tokenizer


def heldout_problems(recipe: ArithmeticDemoRecipe) -> list[dict[str, str]]:
    """The held-out problems every evaluation of this recipe scores (fixed by the seed)."""
    return recipe.task().sample("test", recipe.eval_size, seed=recipe.seed)


def demonstrations(recipe: ArithmeticDemoRecipe, count: int, seed: int) -> list[dict[str, str]]:
    """`count` training problems with the imperfect teacher's answers (a fresh draw per `seed`)."""
    task = recipe.task()
    return task.demonstrations(task.sample("train", count, seed=seed, unique=False), recipe.slip_rate, seed=seed)


def supervised(
    model: PreTrainedModel,
    tokenizer: Any,
    examples: Sequence[dict[str, str]],
    recipe: ArithmeticDemoRecipe,
    steps: int,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> float:
    """`steps` AdamW steps of next-token loss on answers + end-of-sequence; returns the last loss.

    One optimizer across all steps with a short linear warm-up (unlike `m2flow.models.sft.sft_steps`,
    which takes no progress callback); `on_step(step, loss)` follows each step, counting from 1.
    """
    eos = [tokenizer.eos_token_id]
    prompts = [tokenizer(e["prompt"], add_special_tokens=False)["input_ids"] for e in examples]
    answers = [tokenizer(e["answer"], add_special_tokens=False)["input_ids"] + eos for e in examples]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
    scheduler = warmup_schedule(optimizer, SFT_WARMUP_STEPS)
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        idx = rng.integers(0, len(examples), size=recipe.sft_batch_size)
        p_ids, p_mask = left_pad([prompts[i] for i in idx], pad)
        rows = [answers[i] for i in idx]
        r_mask = right_pad([[1] * len(r) for r in rows], 0)
        logp, _ = response_logprobs(model, p_ids, p_mask, right_pad(rows, pad), r_mask)
        loss = -(logp * r_mask).sum() / r_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        loss_value = float(loss.detach())
        if on_step is not None:
            on_step(step + 1, loss_value)
    model.eval()
    return loss_value


def warm_start(recipe: ArithmeticDemoRecipe, on_step: Callable[[int, float], None] | None = None) -> WarmStart:
    """Build the model and train it on the teacher's demonstrations for `recipe.sft_steps` steps."""
    start = time.perf_counter()
    model, tokenizer = build_demo_model(recipe)
    data = demonstrations(recipe, max(1, recipe.sft_steps) * recipe.sft_batch_size, seed=recipe.seed * 7919 + 1)
    supervised(model, tokenizer, data, recipe, recipe.sft_steps, seed=recipe.seed, on_step=on_step)
    return WarmStart(model, tokenizer, recipe.sft_steps, time.perf_counter() - start)


def train_grpo(
    model: PreTrainedModel,
    tokenizer: Any,
    recipe: ArithmeticDemoRecipe,
    heldout: Sequence[dict[str, str]] = (),
    *,
    reward_fn: Callable[[Response, str], float] | None = None,
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """`recipe.grpo_steps` GRPO steps on training problems; one history row per step, also passed to `on_step`.

    Every `recipe.eval_every` steps and after the last (when `heldout` is given) the row also has
    `heldout_accuracy`.
    """
    backend = HFGenerationBackend(model, tokenizer)  # shares the weights: nothing to sync in one process
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    scheduler = warmup_schedule(optimizer, recipe.lr_warmup_steps)
    task = recipe.task()
    history: list[dict[str, float]] = []
    for step in range(recipe.grpo_steps):
        problems = task.sample("train", recipe.prompts_per_step, seed=recipe.seed * 1_000_003 + 50_000 + step)
        stats = grpo_step(model, tokenizer, backend, optimizer, problems, recipe, seed=recipe.seed * 1_000_003 + step, reward_fn=reward_fn, scheduler=scheduler)
        row = {"step": step + 1, "reward": stats.reward, "accuracy": stats.accuracy, "loss": stats.loss,
               "mixed_groups": stats.mixed_groups, "seconds": stats.seconds}
        last = step + 1 == recipe.grpo_steps
        if heldout and (last or (recipe.eval_every and (step + 1) % recipe.eval_every == 0)):
            row["heldout_accuracy"] = evaluate(model, tokenizer, heldout, recipe.max_new_tokens)
            log.info("grpo step %d: sampled accuracy %.3f, held-out %.3f", step + 1, stats.accuracy, row["heldout_accuracy"])
        history.append(row)
        if on_step is not None:
            on_step(row)
    return history


def run_local_grpo(
    recipe: ArithmeticDemoRecipe | None = None,
    *,
    reward_fn: Callable[[Response, str], float] | None = None,
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> LocalRunResult:
    """Warm start, then GRPO, in this process; held-out accuracy (greedy) after each phase."""
    recipe = recipe or ArithmeticDemoRecipe()
    recipe.validate()
    if recipe.threads:
        torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    heldout = heldout_problems(recipe)
    warm = warm_start(recipe)
    warm_acc = evaluate(warm.model, warm.tokenizer, heldout, recipe.max_new_tokens)
    log.info("warm start: %d steps, held-out accuracy %.3f, %.1f s", warm.steps, warm_acc, warm.seconds)
    start = time.perf_counter()
    history = train_grpo(warm.model, warm.tokenizer, recipe, heldout, reward_fn=reward_fn, on_step=on_step)
    grpo_seconds = time.perf_counter() - start
    final_acc = history[-1]["heldout_accuracy"]
    log.info("after GRPO: held-out accuracy %.3f (warm start %.3f), %.1f s", final_acc, warm_acc, grpo_seconds)
    return LocalRunResult(warm_acc, final_acc, warm.steps, warm.seconds, grpo_seconds, history)
