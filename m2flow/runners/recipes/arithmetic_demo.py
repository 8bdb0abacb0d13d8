"""The arithmetic demo recipe: a tiny transformer, a short supervised warm start, then GRPO.

`ArithmeticDemoRecipe` holds the settings (the one source of the demo's defaults);
`run_local_grpo` is the single-process reference loop that the distributed reasoning runner must
match: it uses only library pieces (task, tokenizer, tiny model, SFT, HF generation, GRPO
advantage, PPO clipped loss) and no Ray.

Reward: 1.0 when the response is exactly the answer followed by end-of-sequence, else 0.0; with
`digit_credit > 0`, a wrong answer of the right length earns `digit_credit` x (share of its digits
that are right), a small shaping term that is off by default.

Where this deviates from textbook GRPO: no KL term and no reference model (the warm start is short
and the task verifiable, so nothing needs anchoring), and one optimizer step per rollout batch, so
the PPO ratio is 1 and the clipped loss reduces to the policy gradient (`updates_per_batch > 1`
turns clipping on).
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
from m2flow.data.batch import Response, RolloutBatch
from m2flow.models.causal_lm import response_logprobs
from m2flow.models.sft import sft_steps
from m2flow.models.tiny import TinyModelConfig, build_tiny_model
from m2flow.models.tokenizer import train_char_tokenizer

log = logging.getLogger(__name__)


@dataclass
class ArithmeticDemoRecipe:
    """Settings of the arithmetic demo (task, model, warm start, GRPO, evaluation)."""

    digits: int = option(2, "largest number of digits of each operand")
    operators: tuple[str, ...] = option(("+", "-"), "operators of the problems")
    hidden_size: int = option(128, "width of the tiny Qwen2 model")
    num_layers: int = option(2, "transformer blocks")
    num_heads: int = option(4, "attention heads")
    intermediate_size: int = option(256, "MLP width")
    sft_steps: int = option(60, "supervised warm-start steps (kept short: accuracy must stay mediocre)")
    sft_batch_size: int = option(64, "problems per warm-start step")
    sft_lr: float = option(3e-3, "warm-start learning rate")
    grpo_steps: int = option(150, "GRPO steps (one rollout batch each)")
    prompts_per_step: int = option(32, "prompts per rollout batch")
    group_size: int = option(8, "responses sampled per prompt")
    temperature: float = option(1.0, "sampling temperature of the rollouts")
    max_new_tokens: int = option(4, "most tokens per response (the longest answer is 3 digits + end-of-sequence)")
    lr: float = option(2e-4, "GRPO learning rate")
    lr_warmup_steps: int = option(10, "GRPO steps over which the learning rate rises linearly from 0")
    updates_per_batch: int = option(1, "optimizer steps per rollout batch (1 = fully on-policy)")
    clip: float = option(0.2, "PPO clip range (matters only when updates_per_batch > 1)")
    max_grad_norm: float = option(1.0, "gradient-norm clip of each GRPO update (0: off)")
    digit_credit: float = option(0.0, "shaping: share of right digits in a wrong same-length answer, times this")
    eval_size: int = option(500, "held-out problems scored with greedy decoding")
    eval_every: int = option(25, "GRPO steps between held-out evaluations (0: only at the end)")
    seed: int = option(0, "seed of the model, the data order and the sampling")

    def task(self) -> ArithmeticTask:
        """The arithmetic task of this recipe."""
        return ArithmeticTask(digits=self.digits, operators=tuple(self.operators))

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
    if bool(mixed > 0):
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
    )


@dataclass
class LocalRunResult:
    """Outcome of `run_local_grpo`: held-out accuracy before and after GRPO, and the history."""

    warm_start_accuracy: float
    final_accuracy: float
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


def warm_start(model: PreTrainedModel, tokenizer: Any, recipe: ArithmeticDemoRecipe) -> list[float]:
    """The short supervised warm start on train problems; returns the losses."""
    train = recipe.task().sample("train", recipe.sft_steps * recipe.sft_batch_size, seed=recipe.seed + 10_000, unique=False)
    return sft_steps(model, tokenizer, train, steps=recipe.sft_steps, lr=recipe.sft_lr, batch_size=recipe.sft_batch_size, seed=recipe.seed)


def run_local_grpo(
    recipe: ArithmeticDemoRecipe | None = None,
    *,
    reward_fn: Callable[[Response, str], float] | None = None,
    on_step: Callable[[int, GRPOStats], None] | None = None,
) -> LocalRunResult:
    """Warm start, then GRPO, in this process; held-out accuracy (greedy) before, during and after."""
    recipe = recipe or ArithmeticDemoRecipe()
    torch.manual_seed(recipe.seed)
    task = recipe.task()
    heldout = task.sample("test", recipe.eval_size, seed=recipe.seed)
    model, tokenizer = build_demo_model(recipe)
    t0 = time.perf_counter()
    warm_start(model, tokenizer, recipe)
    warm_seconds = time.perf_counter() - t0
    warm_acc = evaluate(model, tokenizer, heldout, recipe.max_new_tokens)
    log.info("warm start: held-out accuracy %.3f after %.1f s", warm_acc, warm_seconds)

    backend = HFGenerationBackend(model, tokenizer)  # shares the weights: no sync needed in one process
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    scheduler = warmup_schedule(optimizer, recipe.lr_warmup_steps)
    rng = np.random.default_rng(recipe.seed + 20_000)
    pool = task.sample("train", 20_000 if task.space_size > 20_000 else 1000, seed=recipe.seed + 30_000, unique=False)
    history: list[dict[str, float]] = []
    t1 = time.perf_counter()
    for step in range(recipe.grpo_steps):
        problems = [pool[int(i)] for i in rng.choice(len(pool), size=recipe.prompts_per_step, replace=False)]
        stats = grpo_step(model, tokenizer, backend, optimizer, problems, recipe, seed=recipe.seed * 1_000_003 + step, reward_fn=reward_fn, scheduler=scheduler)
        row = {"step": step + 1, "reward": stats.reward, "accuracy": stats.accuracy, "loss": stats.loss, "mixed_groups": stats.mixed_groups}
        last = step + 1 == recipe.grpo_steps
        if recipe.eval_every and (step + 1) % recipe.eval_every == 0 and not last:
            row["heldout_accuracy"] = evaluate(model, tokenizer, heldout, recipe.max_new_tokens)
            log.info("grpo step %d: train acc %.3f held-out %.3f", step + 1, stats.accuracy, row["heldout_accuracy"])
        history.append(row)
        if on_step is not None:
            on_step(step, stats)
    grpo_seconds = time.perf_counter() - t1
    final_acc = evaluate(model, tokenizer, heldout, recipe.max_new_tokens)
    history[-1]["heldout_accuracy"] = final_acc if history else final_acc
    log.info("after GRPO: held-out accuracy %.3f (warm start %.3f) in %.1f s", final_acc, warm_acc, grpo_seconds)
    return LocalRunResult(warm_acc, final_acc, warm_seconds, grpo_seconds, history)
