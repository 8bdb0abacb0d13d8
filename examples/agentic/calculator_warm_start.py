"""A tiny model learns the calculator tool's call format from an imperfect teacher, then plays the task.

Builds a character tokenizer and a 2-layer Qwen2 (hidden 64), warm-starts it on the teacher's
demonstrations (``m2flow.data.calculator_demos``: 20% skip the tool and guess, 10% copy the result
wrong), and plays held-out problems with the episode engine: greedy and sampled with the calculator
tool, and greedy without it (a call then counts as a wrong answer). Prints the figures. With
``--direct`` the same model is instead trained on correct one-turn answers (no tool): the accuracy a
tiny model reaches on these products by itself.

    python examples/agentic/calculator_warm_start.py --steps 1500
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from m2flow.backends.generation.lean import LeanGenerationBackend
from m2flow.data.calculator_demos import CALCULATOR_ALPHABET, CalculatorTeacher, sft_pairs
from m2flow.envs.text import TextEnvBatch
from m2flow.envs.text.calculator import draw_problem, problem_text
from m2flow.models.sft import sft_steps
from m2flow.models.tiny import TinyModelConfig, build_tiny_model
from m2flow.models.tokenizer import train_char_tokenizer
from m2flow.rewards.tools.calls import format_call
from m2flow.workers.agentic import EpisodeConfig, run_episodes


def play(model, tokenizer, tools: bool, episodes: int, seed: int, temperature: float = 0.0) -> dict[str, float]:
    """Held-out accuracy, well-formed call rate and finish reasons over ``episodes`` episodes."""
    backend = LeanGenerationBackend(model, tokenizer)
    envs = TextEnvBatch.from_registry("calculator", episodes, env_kwargs={"split": "test", "tools": tools})
    cfg = EpisodeConfig(max_turns=3, max_tokens=96, max_turn_tokens=40, temperature=temperature, seed=seed)
    seeds = [10_000 + seed * episodes + i for i in range(episodes)]
    trajs, stats = run_episodes(backend, tokenizer, envs, seeds, list(range(episodes)), cfg)
    calls = sum(stats.tool_outcomes.values())
    prompts = [tokenizer.decode(t.prompt_ids).removesuffix("=") for t in trajs]
    exact_calls = sum(bool(t.turn_texts) and t.turn_texts[0] == format_call("calculator", p)
                      for t, p in zip(trajs, prompts))
    return {"accuracy": sum(t.reward for t in trajs) / episodes,
            "calls_per_episode": calls / episodes,
            "well_formed_calls": stats.tool_outcomes["ok"] / max(1, calls),
            "exact_calls": exact_calls / episodes,
            "turns_mean": stats.turns / episodes,
            **{f"finish_{k}": v / episodes for k, v in Counter(t.finish_reason for t in trajs).items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--direct", action="store_true",
                        help="instead: the same model and steps trained on correct direct answers, no tool")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = train_char_tokenizer(CALCULATOR_ALPHABET)
    model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2, seed=args.seed), tokenizer)
    if args.direct:
        # A perfect teacher answering in one turn: how far the model gets without the tool.
        problems = [draw_problem(args.seed * 1_000_003 + k) for k in range(args.steps * 32)]
        pairs = [(problem_text(a, b), str(a * b)) for a, b in problems]
        losses = sft_steps(model, tokenizer, pairs, steps=args.steps, lr=3e-3, batch_size=32, seed=args.seed,
                           warmup_steps=50)
        print(f"direct answers: loss {losses[0]:.3f} -> {sum(losses[-50:]) / 50:.3f}")
        print("direct answers, without the tool:", play(model, tokenizer, False, args.episodes, args.seed))
        return
    print("untrained, with the tool:", play(model, tokenizer, True, args.episodes, args.seed))
    teacher = CalculatorTeacher(skip_rate=0.2, copy_error_rate=0.1)
    demos = teacher.demonstrations(args.steps * 32, seed=args.seed)
    print("teacher:", dict(Counter(d.kind for d in demos)), "correct", sum(d.correct for d in demos) / len(demos))
    start = time.perf_counter()
    losses = sft_steps(model, tokenizer, sft_pairs(demos), steps=args.steps, lr=3e-3, batch_size=32,
                       seed=args.seed, warmup_steps=50)
    print(f"warm start: {args.steps} steps in {time.perf_counter() - start:.0f}s, loss {losses[0]:.3f} -> "
          f"{sum(losses[-50:]) / 50:.3f}")
    print("warm start, with the tool:", play(model, tokenizer, True, args.episodes, args.seed))
    print("warm start, with the tool, sampled at temperature 1:",
          play(model, tokenizer, True, args.episodes, args.seed, temperature=1.0))
    print("warm start, without the tool:", play(model, tokenizer, False, args.episodes, args.seed))


if __name__ == "__main__":
    main()
