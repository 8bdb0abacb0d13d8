"""A1 peer: TRL's `GRPOTrainer` with its own tool calling, on the calculator task, on CPU.

Runs in the environment made by `benchmarks/a1_agentic.py --setup` (TRL 1.16). The task is the one
m2flow trains on (`m2flow/envs/text/calculator.py`): the prompt is the problem, ``123*456=``; the model
may call ``<tool>calculator: 123*456</tool>``, reads ``<result>56088</result>`` and answers; the final
turn is rewarded 1.0 when it is exactly the product. TRL runs it with its own machinery:

- ``tools=[calculator]``: TRL's tool loop generates a turn (until end-of-sequence), parses tool calls
  out of it, runs the tool, appends the result's tokens and generates again, at most
  ``max_tool_calling_iterations`` times; result tokens are masked out of the loss (``tool_mask``).
- TRL reads and writes turns through the tokenizer's chat template and response template, so the
  character tokenizer is given both here: the template renders a user message as its text, an
  assistant tool call as ``<tool>NAME: ARGUMENT</tool>`` followed by end-of-sequence (TRL ends every
  turn at end-of-sequence), a tool message as ``<result>CONTENT</result>``; the response template
  parses the same call back. Rendered, an episode is token for token what the m2flow side plays.
  (TRL checks a template by rendering a call with an argument of its own name; the template writes
  other tools' arguments as ``name=value`` so that check sees the name, and the calculator's one
  argument positionally, as the task's call format has it.)
- The tool is m2flow's calculator (``m2flow.rewards.tools.calculator``, standard library only), so
  both sides compute the same results.
- ``--tool-latency SPEC`` (JSON, a ``tool_latency_s`` spec of ``m2flow/rewards/tools/latency.py``, numpy and
  the standard library only): every call first sleeps a wait drawn from that distribution, the same one the
  m2flow side's tool draws from. The draws come from one generator seeded with the run's ``--seed``, in
  call order: TRL calls a tool with its arguments only, so the per-episode seeding of the m2flow side (each
  episode's waits drawn from its own seed) is not available here; the distribution is the same, the
  individual waits are not. ``--async-tool`` makes the tool a coroutine function (``await
  asyncio.sleep(wait)``), which TRL runs on its event loop thread: TRL 1.16's ``_tool_call_loop``
  gathers the coroutines of one completion's calls but takes the completions one after another, so with
  one call per turn (this task) the waits still add up; the setting is there to measure that.

Settings are the workload's where it fixes them (group size, prompts per step, learning rate, turn
and token budgets, temperature, PPO clip 0.2, no KL, gradient clipping 1.0, one optimizer step per
batch) and TRL's own elsewhere ('dapo' token-level loss, the mean of the tokens of the whole batch,
as m2flow's token-mean; group-scaled rewards). Timing: from the start of the first optimizer step to
the end of the last (every step's generation with its tool calls, reward, loss, backward, optimizer
and TRL's logging between steps); process start, imports and model loading are not in it. The final
weights are saved to ``--save`` for the benchmark's common held-out evaluation. Prints one JSON line.

    benchmarks/.venvs/trl-a1/bin/python benchmarks/peers/trl_agentic.py --workload W/workload.json \
        --threads 1 --save W/trl-final
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from m2flow.rewards.tools.calculator import evaluate, format_number
from m2flow.rewards.tools.latency import ToolLatency, parse_latency

CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' or m['role'] == 'system' -%}{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}{{ m['content'] or '' }}"
    "{%- for c in (m['tool_calls'] or []) -%}<tool>{{ c['function']['name'] }}: "
    "{%- for k, v in c['function']['arguments'].items() -%}"
    "{%- if k != 'expression' -%}{{ k }}={%- endif -%}{{ v }}"
    "{%- endfor -%}</tool>{%- endfor -%}{{ eos_token }}"
    "{%- elif m['role'] == 'tool' -%}<result>{{ m['content'] }}</result>"
    "{%- endif -%}"
    "{%- endfor -%}"
)
"""The task's format as a chat template: no role markers, a turn ends with end-of-sequence."""

RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    # Generation starts after the problem's '=' or after an observation's closing tag.
    "start_anchor": ["=", "</result>"],
    "fields": {
        "tool_calls": {
            "open_pattern": r"<tool>(?P<name>[a-z][a-z0-9_]*):\s*",
            "close": "</tool>",
            "repeats": True,
            "content": "text",
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": {"expression": "{content}"}}},
        },
        "content": {"close": "<eos>", "content": "text"},
    },
}
"""How TRL reads a generated turn back: a ``<tool>NAME: ARGUMENT</tool>`` call, the rest is text."""

_ANSWER = re.compile(r"\s*(-?\d+)\s*")


CALCULATOR_DOC = """Exact arithmetic on an expression of numbers, + - * / // % ** and parentheses.

    Args:
        expression: The arithmetic expression, e.g. 123*456.

    Returns:
        The value of the expression.
    """
"""The tool's description, from which TRL writes its schema (the same for every form of the tool)."""


@dataclass
class Waits:
    """The tool's calls so far and the seconds they were made to wait."""

    calls: int = 0
    seconds: float = 0.0


def make_calculator(latency: ToolLatency | None, seed: int, asynchronous: bool, waits: Waits) -> Callable[..., Any]:
    """The ``calculator`` tool: without ``latency`` the plain function; with it, each call first sleeps a wait
    drawn from ``latency`` by a generator seeded with ``seed`` (in call order), counted in ``waits``;
    ``asynchronous``: a coroutine function that awaits ``asyncio.sleep`` instead (TRL's async tools)."""
    rng = np.random.default_rng(seed)

    def wait() -> float:
        seconds = latency.draw(rng) if latency is not None else 0.0
        waits.calls += 1
        waits.seconds += seconds
        return seconds

    if asynchronous:
        async def calculator(expression: str) -> str:
            if latency is not None:
                await asyncio.sleep(wait())
            return format_number(evaluate(expression))
    else:
        def calculator(expression: str) -> str:
            if latency is not None:
                time.sleep(wait())
            return format_number(evaluate(expression))
    calculator.__doc__ = CALCULATOR_DOC
    return calculator


def answer_reward(completions: list[list[dict[str, Any]]], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the last turn is a plain answer (no tool call) that is exactly the product, as the task scores it."""
    out = []
    for messages, expected in zip(completions, answer):
        last = messages[-1] if messages else {}
        text = last.get("content") or ""
        match = _ANSWER.fullmatch(text)
        ok = last.get("role") == "assistant" and not last.get("tool_calls") and match is not None \
            and int(match.group(1)) == int(expected)
        out.append(1.0 if ok else 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True, help="workload.json written by benchmarks/a1_agentic.py")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--micro-batch", type=int, default=0, help="completions per forward/backward (0: the whole batch)")
    ap.add_argument("--continuous-batching", action="store_true",
                    help="generate with transformers' continuous batching (use_transformers_continuous_batching)")
    ap.add_argument("--tool-latency", default=None,
                    help="each tool call first waits a time drawn from this tool_latency_s spec (JSON), "
                         'e.g. \'{"dist": "lognormal", "median_s": 0.02, "sigma": 1.5, "max_s": 0.5}\'')
    ap.add_argument("--async-tool", action="store_true",
                    help="the tool as a coroutine function (TRL's async tools; it awaits asyncio.sleep for the wait)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", default=None, help="directory for the final weights")
    args = ap.parse_args()
    try:
        latency = parse_latency(json.loads(args.tool_latency)) if args.tool_latency else None
    except ValueError as e:  # json.JSONDecodeError is a ValueError too
        ap.error(f"--tool-latency: {e}")
    waits = Waits()
    calculator = make_calculator(latency, args.seed, args.async_tool, waits)
    w = json.loads(Path(args.workload).read_text())
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    groups, g = w["groups_per_step"], w["group_size"]
    per_step = groups * g
    micro = args.micro_batch or per_step
    # One row per group, in the order the m2flow side plays them; TRL repeats each row group_size times.
    rows = w["problems"][: w["steps"] * groups]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p["prompt"]}] for p in rows],
                                 "answer": [p["answer"] for p in rows]})
    tok = AutoTokenizer.from_pretrained(w["model_dir"], local_files_only=True)
    tok.chat_template = CHAT_TEMPLATE
    tok.response_template = RESPONSE_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(w["model_dir"], local_files_only=True, dtype=torch.float32)

    class Meter(TrainerCallback):
        """The first step's start, and at each step's end the time, the trajectories and tokens so far and the
        tool's calls and waiting so far."""

        def __init__(self) -> None:
            self.first: float | None = None
            self.ends: list[tuple[float, int, int, int, float]] = []

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            if self.first is None:
                self.first = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            self.ends.append((time.perf_counter(), CountingTrainer.trajectories, CountingTrainer.generated_tokens,
                              waits.calls, waits.seconds))

    class CountingTrainer(GRPOTrainer):
        """GRPOTrainer that also counts the trajectories and the tokens the model generated (not the tools')."""

        trajectories = 0
        generated_tokens = 0

        def _generate_and_score_completions(self, inputs):  # noqa: ANN001
            out = super()._generate_and_score_completions(inputs)
            mask = out["completion_mask"]
            if "tool_mask" in out:
                mask = mask * out["tool_mask"]
            CountingTrainer.trajectories += int(mask.shape[0])
            CountingTrainer.generated_tokens += int(mask.sum())
            return out

    meter = Meter()
    with tempfile.TemporaryDirectory(prefix="a1-trl-") as out:
        config = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            seed=args.seed,
            data_seed=args.seed,
            learning_rate=w["lr"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=w["grad_clip"],
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=per_step // micro,
            num_generations=g,
            max_completion_length=w["max_tokens"],
            max_tool_calling_iterations=w["max_turns"] - 1,
            generation_kwargs={"max_new_tokens": w["max_turn_tokens"]},
            temperature=w["temperature"],
            top_p=1.0,
            top_k=0,
            beta=0.0,
            epsilon=w["clip"],
            loss_type="dapo",
            scale_rewards="group",
            num_iterations=1,
            shuffle_dataset=False,
            max_steps=w["steps"],
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            gradient_checkpointing=False,
            use_transformers_continuous_batching=args.continuous_batching,
        )
        trainer = CountingTrainer(
            model=model,
            reward_funcs=answer_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tok,
            tools=[calculator],
            callbacks=[meter],
        )
        trainer.train()
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    if args.save:
        model.save_pretrained(args.save)
        AutoTokenizer.from_pretrained(w["model_dir"], local_files_only=True).save_pretrained(args.save)
    # From the first timed step's start (the end of the workload's warm-up steps) to the last step's end.
    k = w.get("warmup_steps", 0)
    start, traj0, tok0, calls0, wait0 = meter.ends[k - 1] if k else (meter.first, 0, 0, 0, 0.0)
    last, traj, tok, calls, wait = meter.ends[-1]
    seconds = last - start
    print(json.dumps({
        "side": "trl", "threads": args.threads, "micro_batch": micro,
        "continuous_batching": args.continuous_batching, "async_tool": args.async_tool,
        "tool_latency": json.loads(args.tool_latency) if args.tool_latency else None,
        # The timed steps' tool calls and the seconds they were made to wait (summed over calls).
        "tool_calls": calls - calls0, "tool_wait_s": wait - wait0,
        "steps": len(meter.ends), "warmup_steps": k,
        "warmup_seconds": start - meter.first, "seconds": seconds,
        "trajectories": traj - traj0, "generated_tokens": tok - tok0,
        "trajectories_per_s": (traj - traj0) / seconds, "tokens_per_s": (tok - tok0) / seconds,
        "train_reward_first": rewards[0] if rewards else None, "train_reward_last": rewards[-1] if rewards else None,
        "train_reward_mean": sum(rewards) / len(rewards) if rewards else None, "train_rewards": rewards,
        "versions": {"trl": __import__("trl").__version__, "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
    }))


if __name__ == "__main__":
    main()
