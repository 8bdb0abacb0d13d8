"""Benchmark G3: a long-tail reasoning workload, partial rollouts against the same plan without them.

The workload: GRPO on arithmetic prompts with a tiny random Qwen2 (2 layers, hidden 64) on the lean
backend with continuous batching. Untrained, the model puts ~1/19 of its probability on the
end-of-sequence token at every step, so response lengths are geometric: most responses are short and a
few run to ``max_new_tokens`` (the spread within one step is printed, measured on the first step's
prompts). The reward is the parity of the completion text's CRC32 (G1's: cheap, never constant, blind to
length), so training does not move the lengths much over the few steps measured.

Sides, the same config except ``rollout.partial`` and the staleness bound (all: behaviour log-probs from
the rollout, placement ``local``):

- ``full``: every iteration waits for its slowest response (the rollout runs one iteration ahead);
- ``partial``: an iteration trains on the groups that finished first; the rest continue in the next
  iteration (the rollout does not run ahead: carried tokens use the staleness bound);
- ``partial_s2``: the same with ``max_staleness: 2``, so the rollout runs one iteration ahead, as
  ``full`` does (the same overlap of generation with training; carried tokens up to two versions old);
- ``trl_tN``: TRL's ``GRPOTrainer`` on the same model directory, prompts, group size, length limit, sampling,
  learning rate and reward, with N torch threads (``--trl-threads``; G1's peer script,
  ``peers/trl_grpo.py``, in the environment ``g1_reasoning.py --setup`` makes). TRL generates with
  transformers ``generate``, each batch until its longest response ends; its step is timed from the
  step's start to its end by a trainer callback, the same span as m2flow's ``time/step``.

Every side reads one model directory built once per invocation (the run config's tiny model), so all
start from the same weights.

Both may decode ``--max-running`` rows at once (default: two iterations' responses, room for the
carried prompts and the new ones together; the full side never fills more than one iteration's). With
room for one iteration only, the partial side's new prompts enter one by one as rows free, and each
entry copies the running KV cache (``DecodeState.merge``), which costs more than it saves here.

Sides alternate (A B A B ...), the first ``--warmup`` iterations of each run are left out, and figures
are medians over rounds. Completions/s counts responses trained per second of iteration wall time.
Before the runs, generation alone (fixed weights, no training) is measured both ways: decoding steps
(forward calls) per iteration, tokens and seconds, which says where the time of a step goes.

    python benchmarks/g3_long_tail.py                     # 16 prompts x 4 samples, up to 96 tokens
    python benchmarks/g3_long_tail.py --rounds 3 --steps 10 --max-new-tokens 128
    python benchmarks/g3_long_tail.py --rounds 3 --trl-threads 1,2     # with TRL beside (after g1's --setup)

Writes ``benchmarks/results/g3.json`` (or ``--out NAME``: ``NAME.json``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # m2flow, and this module for the reward workers

from common import environment, write_result  # noqa: E402


def parity_reward(response: str, reference: str) -> float:
    """The benchmark's reward on a completion's text: parity of its CRC32."""
    return float(zlib.crc32(response.encode()) & 1)


# side -> (rollout.partial, algorithm.max_staleness)
SIDES = {"full": (False, 1), "partial": (True, 1), "partial_s2": (True, 2)}


TRL_PYTHON = HERE / ".venvs" / "trl" / "bin" / "python"


def config(args: argparse.Namespace, root: Path, partial: bool, staleness: int, model_dir: Path | None = None) -> Any:
    """The reasoning config of one side (its tiny model built at ``root/model``, or read from ``model_dir``)."""
    from m2flow.config.convert import from_dict
    from m2flow.workflows.reasoning.config import ReasoningConfig

    return from_dict(ReasoningConfig, {
        "placement": "local",
        "seed": args.seed,
        "model": {"path": str(model_dir or root / "model"), "create_tiny": True,
                  "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "seed": args.seed}},
        "data": {"prompts_per_step": args.prompts, "shuffle": False,
                 "arithmetic": {"train_size": args.prompts * (args.steps + 2), "test_size": 8}},
        "rollout": {"backend": "lean", "partial": partial, "fuse_with_actor": False,
                    "max_running": args.max_running or 2 * args.prompts * args.group,
                    "sampling": {"n": args.group, "temperature": 1.0, "max_new_tokens": args.max_new_tokens}},
        "reward": {"fn": f"{Path(__file__).stem}:parity_reward", "num_threads": 1, "isolate": False},
        "actor": {"optim": {"lr": 1e-5}, "micro_batch_size": args.prompts * args.group, "forward": "packed"},
        "algorithm": {"adv_estimator": "grpo", "old_logprobs": "rollout", "max_staleness": staleness},
        "steps": args.steps,
        "run_dir": str(root / "run"),
        "metrics": {"sinks": ["jsonl"]},
    })


def shared_model(args: argparse.Namespace, workdir: Path) -> Path:
    """The run config's tiny model and tokenizer, built once in ``workdir`` for every side."""
    from m2flow.workflows.reasoning.data import prepare_model

    cfg = config(args, workdir, False, 1)
    return prepare_model(cfg.model, cfg.data)


def trl_workload(args: argparse.Namespace, model_dir: Path, workdir: Path) -> Path:
    """The TRL peer's workload file: the shared model, arithmetic prompts, and the m2flow sides' settings."""
    from m2flow.data.arithmetic import ArithmeticTask

    count = args.prompts * (args.steps + 2)
    prompts = [p["prompt"] for p in ArithmeticTask(digits=2).sample("train", count, seed=args.seed)]
    workload = {"model_dir": str(model_dir), "prompts": prompts, "prompts_per_step": args.prompts,
                "group_size": args.group, "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
                "lr": 1e-5, "steps": args.steps - args.warmup, "warmup_steps": args.warmup, "seed": args.seed}
    path = workdir / "workload.json"
    path.write_text(json.dumps(workload))
    return path


def run_trl(workload: Path, threads: int) -> dict[str, float]:
    """One TRL run in its own environment and process; its figures over the steps after the warm-up."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([str(TRL_PYTHON), str(HERE / "peers" / "trl_grpo.py"), "--workload", str(workload),
                           "--threads", str(threads)], env=env, capture_output=True, text=True, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"TRL failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    return {"completions_per_s": out["completions_per_s"], "tokens_per_s": out["tokens_per_s"],
            "seconds_per_step": out["seconds_per_step"], "mean_response_tokens": out["mean_completion_tokens"]}


def run_side(args: argparse.Namespace, side: str, model_dir: Path) -> dict[str, float]:
    """One training run; completions/s and tokens/s over the iterations after the warm-up."""
    from m2flow.driver.run import Run
    from m2flow.workflows.reasoning.workflow import WORKFLOW

    with tempfile.TemporaryDirectory(prefix="g3-") as tmp:
        with Run(WORKFLOW, config(args, Path(tmp), *SIDES[side], model_dir=model_dir)) as run:
            history = run.train().history[args.warmup:]
    seconds = sum(h["time/step"] for h in history)
    completions = sum(h["rollout/responses_count"] for h in history)
    tokens = sum(h["rollout/tokens_count"] for h in history)
    return {"completions_per_s": completions / seconds, "tokens_per_s": tokens / seconds,
            "seconds_per_step": seconds / len(history), "mean_response_tokens": tokens / completions,
            "resumed_groups_per_step": sum(h.get("rollout/partial_resumed_count", 0.0) for h in history) / len(history)}


def _tiny_backend(args: argparse.Namespace) -> tuple[Any, Any, list[list[int]]]:
    """The untrained model of the runs on the lean backend, its tokenizer, and prompts for every iteration."""
    from m2flow.backends.generation import LeanGenerationBackend
    from m2flow.data.arithmetic import ARITHMETIC_ALPHABET, ArithmeticTask
    from m2flow.models.tiny import TinyModelConfig, build_tiny_model
    from m2flow.models.tokenizer import train_char_tokenizer

    tok = train_char_tokenizer([ARITHMETIC_ALPHABET])
    model = build_tiny_model(TinyModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, seed=args.seed), tok)
    count = args.prompts * (args.steps + 1)
    prompts = [tok(p["prompt"])["input_ids"] for p in ArithmeticTask(digits=2).sample("train", count, seed=0)]
    return LeanGenerationBackend(model, tok), tok, prompts


def length_spread(args: argparse.Namespace) -> dict[str, float]:
    """Response lengths of one iteration's prompts under the untrained model: min, quantiles, max."""
    import torch

    from m2flow.backends.generation import SamplingParams

    backend, _, prompts = _tiny_backend(args)
    prompts = prompts[: args.prompts]
    params = SamplingParams(n=args.group, temperature=1.0, max_new_tokens=args.max_new_tokens)
    with torch.no_grad():
        groups = [g for b in backend.generate_stream(prompts, params, list(range(len(prompts))), 512) for g in b]
    lengths = sorted(len(r.token_ids) for g in groups for r in g.responses)
    q = statistics.quantiles(lengths, n=10)
    return {"min": lengths[0], "p10": q[0], "median": statistics.median(lengths), "p90": q[-1], "max": lengths[-1],
            "max_over_p10": lengths[-1] / q[0]}


def generation_only(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Generation alone, no training, fixed weights: ``--steps`` iterations of ``--prompts`` prompts, every
    group waited for (full) or partial rollouts' step (``PartialRollouts``, the first over-provisioned);
    decoding steps (forward calls), tokens handed out and seconds per iteration."""
    import torch

    from m2flow.backends.generation import SamplingParams
    from m2flow.workers.messages import PromptTask
    from m2flow.workers.partial import PartialRollouts

    backend, _, prompts = _tiny_backend(args)
    params = SamplingParams(n=args.group, temperature=1.0, max_new_tokens=args.max_new_tokens)
    rows = args.max_running or 2 * args.prompts * args.group
    calls = [0]
    decode = backend.decoder.decode

    def counted(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return decode(*a, **k)

    backend.decoder.decode = counted
    out: dict[str, dict[str, float]] = {}
    p = args.prompts
    for side in ("full", "partial"):
        calls[0], tokens = 0, 0
        partial, taken = PartialRollouts(1), 0
        t0 = time.perf_counter()
        for step in range(args.steps):
            with torch.no_grad():
                if side == "full":
                    ids = prompts[step * p : (step + 1) * p]
                    groups = [g for b in backend.generate_stream(ids, params, list(range(step * p, (step + 1) * p)),
                                                                 rows) for g in b]
                else:
                    new = [(PromptTask(step, k, taken + k, prompts[(taken + k) % len(prompts)], None), taken + k)
                           for k in range(2 * p if step == 0 else p)]
                    taken += len(new)
                    done: list = []
                    partial.step(lambda ids, seeds, flight: backend.generate_stream(ids, params, seeds, rows,
                                                                                   flight=flight),
                                 step, 0, new, list(range(p)), done.extend)
                    groups = [g for _, g in done]
            tokens += sum(len(r.token_ids) for g in groups for r in g.responses)
        seconds = time.perf_counter() - t0
        out[side] = {"decode_steps_per_iteration": calls[0] / args.steps, "tokens_per_iteration": tokens / args.steps,
                     "seconds_per_iteration": seconds / args.steps}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="prompts per iteration")
    parser.add_argument("--group", type=int, default=4, help="responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-running", type=int, default=0,
                        help="rows decoded at once, both sides (0: two iterations' responses, 2 x prompts x group)")
    parser.add_argument("--steps", type=int, default=8, help="iterations per run")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of each run's figures")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl-threads", default="",
                        help="comma-separated torch thread counts of TRL sides (e.g. 1,2; empty: no TRL side)")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated m2flow sides")
    parser.add_argument("--no-generation-only", action="store_true", help="skip the generation-alone measurement")
    parser.add_argument("--out", default="g3", help="result file name under benchmarks/results/")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    trl_threads = [int(t) for t in args.trl_threads.split(",") if t]
    if trl_threads and not TRL_PYTHON.exists():
        parser.error(f"no TRL environment at {TRL_PYTHON}: run `python benchmarks/g1_reasoning.py --setup` first")
    workdir = Path(tempfile.mkdtemp(prefix="g3-model-"))
    model_dir = shared_model(args, workdir)
    workload = trl_workload(args, model_dir, workdir)
    spread = length_spread(args)
    alone = None if args.no_generation_only else generation_only(args)
    m2flow_sides = [s for s in args.sides.split(",") if s]
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in m2flow_sides + [f"trl_t{t}" for t in trl_threads]}
    for r in range(args.rounds):
        for side in runs:
            t0 = time.perf_counter()
            if side.startswith("trl_t"):
                runs[side].append(run_trl(workload, int(side[len("trl_t"):])))
            else:
                runs[side].append(run_side(args, side, model_dir))
            print(f"  round {r + 1}/{args.rounds} {side}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    med = {side: {k: statistics.median(row[k] for row in rows) for k in rows[0]} for side, rows in runs.items()}
    ratios = ({side: med[side]["completions_per_s"] / med["full"]["completions_per_s"] for side in m2flow_sides
               if side != "full"} if "full" in med else {})
    trl_best = max((med[f"trl_t{t}"]["completions_per_s"] for t in trl_threads), default=None)
    over_trl = {side: med[side]["completions_per_s"] / trl_best for side in m2flow_sides} if trl_best else {}
    steps_ratio = (alone["partial"]["decode_steps_per_iteration"] / alone["full"]["decode_steps_per_iteration"]
                   if alone else None)
    result = {"workload": vars(args), "length_spread": spread, "generation_only": alone, "runs": runs, "medians": med,
              "over_full_completions_per_s": ratios, "over_trl_best_completions_per_s": over_trl,
              "partial_over_full_decode_steps": steps_ratio, "environment": environment()}
    path = write_result(args.out, result)
    print(json.dumps({"lengths": spread,
                      "completions_per_s": {side: round(m["completions_per_s"], 2) for side, m in med.items()},
                      "over_full": {side: round(r, 3) for side, r in ratios.items()},
                      "over_trl_best": {side: round(r, 3) for side, r in over_trl.items()},
                      "generation_only": {k: {m: round(v, 3) for m, v in d.items()} for k, d in (alone or {}).items()},
                      "partial_over_full_decode_steps": steps_ratio and round(steps_ratio, 3), "result": str(path)}))
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
