"""Benchmark G1: reasoning GRPO on a tiny Qwen2 model, completions/s and tokens/s, m2flow vs TRL.

All sides train the same tiny Qwen2-architecture model (saved once to a local directory), on the
same arithmetic prompts in the same order, with the same group size, sampling temperature and
maximum completion length, the same reward (parity of the completion text's CRC32: cheap, never
constant, so every step trains) and one AdamW update per rollout batch without a KL term:
- ``trl``: TRL ``GRPOTrainer`` on CPU (its own virtual environment, ``--setup``);
- ``bare``: a hand-written torch loop doing only that compute (the limit);
- ``m2flow:PLAN``: the reasoning runner (``m2flow.workflows.reasoning.flow``) under each plan of ``PLANS``
  (placement and micro-batching), one side per plan; ``PLAN+lean`` is the same plan with the
  ``lean`` generation backend instead of HF ``generate`` (``rollout.backend``) and the packed training
  forward instead of the HF model's (``actor.forward``), both over the same weights;
  ``PLAN+lean+compile`` also runs the lean backend's decoding steps ``torch.compile``d
  (``rollout.compile``; the compile falls in the untimed warm-up iterations, like start-up).
Each run is a fresh process that prints one JSON line; sides alternate (A B C A B C ...) for every
thread count, figures are medians, and each side is compared at its own fastest thread setting.

    python benchmarks/g1_reasoning.py --setup              # TRL environment: benchmarks/.venvs/trl
    python benchmarks/g1_reasoning.py                      # 8 prompts x 4 samples x 16 tokens
    python benchmarks/g1_reasoning.py --plans collocated,disaggregated --threads 1,2 --trace-dir runs/g1
    python benchmarks/g1_reasoning.py --plans collocated,collocated+lean,collocated_2dev+lean

Writes ``benchmarks/results/g1.json`` (or ``--out``) and prints one summary line. With
``--trace-dir`` every runner run keeps its directory (trace included) for ``m2flow report DIR``.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRL_VENV = HERE / ".venvs" / "trl"
# The peer's own environment, pinned; torch and transformers at the releases m2flow uses
# (a CPU build of torch is what is served here).
TRL_PACKAGES = ["torch==2.13.0", "transformers==5.24.0", "trl==1.13.0", "accelerate", "datasets", "requests"]

# Which m2flow code drives the m2flow side: "runner", the reasoning runner (m2flow.workflows.reasoning.flow),
# one side per named placement. (An earlier single-process stand-in, "local_reference", went with the
# arithmetic recipe it borrowed its GRPO step from; results labelled with it predate that.)
M2FLOW_SIDE = "runner"


@dataclass(frozen=True)
class RunnerPlan:
    """One execution plan of the reasoning runner: where components run and how an iteration is cut."""

    placement: str
    prompts_per_chunk: int | None = None
    """Prompts per generate call (None: the whole batch in one call)."""
    micro_batch_prompts: int | None = None
    """Prompts per actor forward/backward (None: the whole batch in one pass)."""
    max_threads: int | None = None
    """Most torch threads per worker worth trying (None: any). Plans that keep two processes busy
    at once already fill both cores with one thread each; more threads only oversubscribe them."""
    staleness: int = 0
    """``algorithm.max_staleness``: with s > 0 the rollout generates up to s iterations ahead of the
    actor, and the behaviour log-probs are the generator's own (``old_logprobs: rollout``)."""


# The plans compared. Reward and inference (which computes nothing here: no KL, and the actor's own
# detached forward gives the old log-probs) sit with rollout, so only generation and training keep
# processes busy. A device is a CPU slot; each busy worker runs ``--threads`` torch threads.
PLANS = {
    # Everything on one device: generation, then training, in turn, each with the whole batch; the
    # rollout is fused into the actor process (rollout.fuse_with_actor), generating from its weights.
    "collocated": RunnerPlan("actor,rollout,inference,reward: 0"),
    # Everything on two devices: two actor ranks, each generating half the prompts from its own copy
    # of the policy (fused as above), then training on its half (data parallel, gradients all-reduced).
    "collocated_2dev": RunnerPlan("actor,rollout,inference,reward: 0-1", max_threads=1),
    # Generation and training on separate devices, pipelined: the actor's forward/backward of one
    # chunk runs while the rollout generates the next; gradients accumulate, one optimizer step.
    "disaggregated": RunnerPlan("rollout,reward,inference: 0, actor: 1", prompts_per_chunk=4, micro_batch_prompts=4,
                                max_threads=1),
    # Generation on device 0; training data-parallel over devices 0 and 1 (two actor ranks, the
    # first taking turns with generation).
    "hybrid": RunnerPlan("rollout,reward,inference: 0, actor: 0-1", max_threads=1),
    # Streaming: generation and training on separate devices, the whole batch in one generate call;
    # with a continuous-batching backend (lean) each group leaves generation as it finishes and the
    # actor trains micro-batches of 2 prompts while the rest of the batch generates.
    "disaggregated_stream": RunnerPlan("rollout,reward,inference: 0, actor: 1", micro_batch_prompts=2, max_threads=1),
    # The same with bounded staleness 1: the rollout generates iteration k + 1 while the actor trains k.
    "disaggregated_stream_s1": RunnerPlan("rollout,reward,inference: 0, actor: 1", micro_batch_prompts=2,
                                          max_threads=1, staleness=1),
    # Hybrid with staleness 1: generation on device 0 ahead of two data-parallel actor ranks.
    "hybrid_s1": RunnerPlan("rollout,reward,inference: 0, actor: 0-1", max_threads=1, staleness=1),
}


@dataclass(frozen=True)
class Side:
    """One contender: the command of one run, and why it cannot run here (None if it can)."""

    name: str
    command: list[str]
    unavailable: str | None = None


BACKENDS = ("hf", "lean", "lean+compile")
TRAINING_FORWARD = {"hf": "hf", "lean": "packed"}
"""The actor's forward (``actor.forward``) that goes with each generation backend."""


def plan_and_backend(name: str) -> tuple[RunnerPlan, str]:
    """``PLAN`` or ``PLAN+BACKEND`` -> the plan and the rollout's generation backend (default hf;
    ``lean+compile``: the lean backend with compiled decoding steps)."""
    base, _, backend = name.partition("+")
    if base not in PLANS or (backend or "hf") not in BACKENDS:
        raise ValueError(f"unknown plan {name!r}; valid: PLAN or PLAN+BACKEND, PLAN in {list(PLANS)}, "
                         f"BACKEND in {list(BACKENDS)}")
    return PLANS[base], backend or "hf"


def _trl_python() -> Path:
    return TRL_VENV / "bin" / "python"


def sides(workload: Path, threads: int, plans: list[str], trace_dir: Path | None = None,
          ray_address: str | None = None) -> dict[str, Side]:
    """The contenders for one thread count: one m2flow side per plan (runner), TRL, the bare loop."""
    common = ["--workload", str(workload), "--threads", str(threads)]
    trl_missing = None if _trl_python().exists() else f"no {TRL_VENV}; run with --setup first"
    me = [sys.executable, str(Path(__file__).resolve()), "--m2flow-side", "--m2flow-impl", M2FLOW_SIDE, *common]
    out: dict[str, Side] = {}
    if M2FLOW_SIDE == "runner":
        for plan in plans:
            limit = plan_and_backend(plan)[0].max_threads
            if limit is not None and threads > limit:
                continue
            extra = ["--trace-dir", str(trace_dir)] if trace_dir else []
            extra += ["--ray-address", ray_address] if ray_address else []
            out[f"m2flow:{plan}"] = Side(f"m2flow:{plan}", [*me, "--plan", plan, *extra])
    else:
        out["m2flow"] = Side("m2flow", me)
    out["trl"] = Side("trl", [str(_trl_python()), str(HERE / "peers" / "trl_grpo.py"), *common], trl_missing)
    out["bare"] = Side("bare", [sys.executable, str(HERE / "peers" / "torch_grpo_loop.py"), *common])
    return out


def setup() -> None:
    """Create the TRL peer's virtual environment and install its pinned packages."""
    if not _trl_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    subprocess.run([str(_trl_python()), "-m", "pip", "install", "-q", *TRL_PACKAGES], check=True)
    print(f"trl peer ready in {TRL_VENV}")


def make_workload(args: argparse.Namespace, workdir: Path) -> Path:
    """Save the tiny model (with its tokenizer) and write workload.json describing one run."""
    from m2flow.data.arithmetic import ARITHMETIC_ALPHABET, ArithmeticTask
    from m2flow.models.tiny import TinyModelConfig, make_tiny_checkpoint
    from m2flow.models.tokenizer import train_char_tokenizer

    tok = train_char_tokenizer([ARITHMETIC_ALPHABET])
    shape = TinyModelConfig(
        arch="qwen2", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=4, intermediate_size=512,
        max_position_embeddings=256, seed=args.seed,
    )
    model_dir = make_tiny_checkpoint(workdir / "model", tok, shape)
    prompts = [p["prompt"] for p in ArithmeticTask(digits=2).sample("train", 1024, seed=args.seed)]
    workload = {
        "model_dir": str(model_dir), "prompts": prompts, "prompts_per_step": args.prompts,
        "group_size": args.group, "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
        "lr": 1e-5, "steps": args.steps, "warmup_steps": args.warmup, "seed": args.seed,
    }
    # The same prompts as a prompt file, for the reasoning runner (answers are unused by the reward).
    lines = [json.dumps({"prompt": text, "answer": "0"}) for text in prompts]
    (workdir / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    workload["prompts_file"] = str(workdir / "prompts.jsonl")
    path = workdir / "workload.json"
    path.write_text(json.dumps(workload))
    return path


def run_side(side: Side, threads: int, timeout: float) -> dict:
    """One run in a fresh process; its JSON line."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    # ROOT for m2flow, HERE so the runner's reward workers can import this module's reward.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(HERE), env.get("PYTHONPATH")]))
    for _ in range(3):
        proc = subprocess.run(side.command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        # On a heavily loaded machine Ray's node can miss its fixed 30 s start-up deadline: try again.
        if "timed out during startup" not in proc.stderr:
            break
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{side.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- the m2flow side


def m2flow_side(workload_path: str, threads: int, plan: str = "collocated", trace_dir: str | None = None,
                ray_address: str | None = None) -> dict:
    """Run the m2flow side in this process and return its figures."""
    if M2FLOW_SIDE == "runner":
        w = json.loads(Path(workload_path).read_text())
        return _runner_side(w, threads, plan, trace_dir, ray_address)
    raise ValueError(f"unknown M2FLOW_SIDE {M2FLOW_SIDE!r}; valid: ['runner']")


def parity_reward(response: str, reference: str) -> float:
    """The benchmark's reward on a completion's text: parity of its CRC32."""
    return float(zlib.crc32(response.encode()) & 1)


def runner_config(w: dict, threads: int, plan: RunnerPlan, run_dir: str, trace: bool = False,
                  ray_address: str | None = None, backend: str = "hf") -> Any:
    """The reasoning runner's config for the workload under ``plan``, ``threads`` torch threads per busy worker."""
    from m2flow.config.convert import from_dict
    from m2flow.workflows.reasoning.config import ReasoningConfig

    p, g = w["prompts_per_step"], w["group_size"]
    return from_dict(ReasoningConfig, {
        "cluster": {"address": ray_address},
        "placement": plan.placement,
        "model": {"path": w["model_dir"]},
        "data": {"kind": "file", "path": w["prompts_file"], "prompts_per_step": p, "shuffle": False},
        "rollout": {"sampling": {"n": g, "temperature": w["temperature"], "max_new_tokens": w["max_new_tokens"]},
                    "prompts_per_chunk": plan.prompts_per_chunk, "num_threads": threads,
                    "backend": backend.partition("+")[0], "compile": backend.endswith("+compile")},
        # Reward and inference do next to nothing here: one thread each keeps them off the busy cores.
        # The reward is scored in process (no sandbox round trip), as TRL and the bare loop score theirs.
        "reward": {"fn": f"{Path(__file__).stem}:parity_reward", "num_threads": 1, "isolate": False},
        "inference": {"num_threads": 1},
        # No KL (so no reference model) and the actor's own detached forward as the old policy (so no
        # extra pass): one forward/backward per response and one optimizer step per batch, as the others.
        "actor": {"optim": {"lr": w["lr"]}, "num_threads": threads,
                  "forward": TRAINING_FORWARD[backend.partition("+")[0]],
                  "micro_batch_size": (plan.micro_batch_prompts or p) * g},
        # With staleness the actor's forward is the proximal policy and the generator's log-probs the
        # behaviour policy's (no extra pass either way).
        "algorithm": {"adv_estimator": "grpo", "old_logprobs": "rollout" if plan.staleness else "actor",
                      "kl_loss_coef": 0.0, "max_staleness": plan.staleness},
        "steps": w["warmup_steps"] + w["steps"],
        "seed": w["seed"],
        "run_dir": run_dir,
        "trace": trace,
    })


def _runner_side(w: dict, threads: int, plan_name: str, trace_dir: str | None, ray_address: str | None) -> dict:
    """`m2flow.workflows.reasoning.train` on the workload under ``PLANS[plan_name]``; warm-up iterations left out.

    With ``trace_dir`` the run keeps its directory there (with a trace: ``m2flow report`` reads it).
    """
    from m2flow.autoplan.entry import train
    from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING

    plan, backend = plan_and_backend(plan_name)
    with tempfile.TemporaryDirectory(prefix="g1-m2flow-") as tmp:
        run_dir = tmp
        if trace_dir:
            run_dir = str(Path(trace_dir) / f"{plan_name.replace('+', '-')}-t{threads}-{time.strftime('%H%M%S')}")
        cfg = runner_config(w, threads, plan, run_dir, trace=bool(trace_dir), ray_address=ray_address,
                            backend=backend)
        history = train(REASONING, cfg).history[w["warmup_steps"]:]
    total = sum(h["time/step"] for h in history)
    completions = sum(h["perf/completions_per_s"] * h["time/step"] for h in history)
    tokens = sum(h["perf/tokens_per_s"] * h["time/step"] for h in history)
    return {
        "side": f"m2flow:{plan_name}", "implementation": f"reasoning runner, placement {plan.placement!r}",
        "plan": {"placement": plan.placement, "prompts_per_chunk": plan.prompts_per_chunk,
                 "micro_batch_prompts": plan.micro_batch_prompts, "backend": backend, "staleness": plan.staleness},
        "run_dir": run_dir if trace_dir else None, "threads": threads, "steps": len(history), "seconds_per_step": total / len(history),
        "completions_per_s": completions / total, "tokens_per_s": tokens / total,
        "mean_completion_tokens": tokens / max(1.0, completions),
    }


# ----------------------------------------------------------------------------- driver


def summarize(runs: dict[str, dict[int, list[dict]]]) -> dict:
    """Medians per side and thread count, each side's fastest setting, and the ratios between them."""
    out: dict = {"by_threads": {}, "best": {}}
    for name, per_threads in runs.items():
        med = {}
        for threads, rows in per_threads.items():
            med[threads] = {
                k: round(statistics.median(r[k] for r in rows), 4)
                for k in ("completions_per_s", "tokens_per_s", "seconds_per_step", "mean_completion_tokens")
            }
        out["by_threads"][name] = med
        if med:
            threads = max(med, key=lambda t: med[t]["completions_per_s"])
            out["best"][name] = {"threads": threads, **med[threads]}
    best = out["best"]
    ours = [n for n in best if n.startswith("m2flow")]
    if ours:
        out["fastest_m2flow"] = max(ours, key=lambda n: best[n]["completions_per_s"])
    for a in ours + ["bare"]:
        for b in ("trl", "bare"):
            if a != b and a in best and b in best:
                out[f"{a}_vs_{b}_completions"] = round(best[a]["completions_per_s"] / best[b]["completions_per_s"], 3)
    return out


def main() -> None:
    global M2FLOW_SIDE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true", help="create the TRL environment and exit")
    ap.add_argument("--m2flow-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="longest completion")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each run")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side per thread count (A B C A B C ...)")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts to try")
    ap.add_argument("--sides", default="m2flow,trl,bare", help="comma-separated sides (m2flow: one per plan)")
    ap.add_argument("--plans", default=",".join([*PLANS, *(f"{p}+lean" for p in PLANS)]),
                    help=f"comma-separated runner plans, each a side of its own: {', '.join(PLANS)}, each "
                         "optionally +lean (the lean generation backend) or +lean+compile")
    ap.add_argument("--plan", default="collocated", help=argparse.SUPPRESS)
    # Runner sides attach to this Ray instead of starting their own (a multi-node cluster). Hidden: a
    # second process attaching to m2flow's loopback-bound local Ray hangs in ray.init.
    ap.add_argument("--ray-address", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trace-dir", default=None,
                    help="keep each runner run's directory here, with its trace (see `m2flow report`)")
    ap.add_argument("--m2flow-impl", choices=["runner"], default=None,
                    help=f"override M2FLOW_SIDE (default {M2FLOW_SIDE})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed for one run")
    ap.add_argument("--out", default=str(HERE / "results" / "g1.json"))
    args = ap.parse_args()
    if args.setup:
        setup()
        return
    M2FLOW_SIDE = args.m2flow_impl or M2FLOW_SIDE
    if args.m2flow_side:
        print(json.dumps(m2flow_side(args.workload, int(args.threads), args.plan, args.trace_dir, args.ray_address)))
        return
    thread_counts = [int(t) for t in args.threads.split(",")]
    plans = args.plans.split(",")
    for p in plans:
        try:
            plan_and_backend(p)
        except ValueError as e:
            ap.error(str(e))
    names = []
    for n in args.sides.split(","):
        names += [f"m2flow:{p}" for p in plans] if n == "m2flow" and M2FLOW_SIDE == "runner" else [n]
    trace_dir = Path(args.trace_dir).resolve() if args.trace_dir else None
    runs: dict[str, dict[int, list[dict]]] = {n: {} for n in names}
    skipped: dict[str, str] = {}
    failed: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="g1-") as tmp:
        workload = make_workload(args, Path(tmp))
        for threads in thread_counts:
            contenders = sides(workload, threads, plans, trace_dir, args.ray_address)
            for _ in range(args.repeats):
                for name in names:
                    if name not in contenders:  # a plan not tried at this thread count
                        continue
                    side = contenders[name]
                    if side.unavailable:
                        skipped[name] = side.unavailable
                        continue
                    try:
                        row = run_side(side, threads, args.timeout)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:  # keep the other sides' figures
                        failed.setdefault(name, []).append(f"threads={threads}: {str(e)[-1500:]}")
                        print(f"  {name} threads={threads} FAILED", file=sys.stderr)
                        continue
                    runs[name].setdefault(threads, []).append(row)
                    print(f"  {name:20s} threads={threads} {row['completions_per_s']:8.1f} completions/s "
                          f"{row['tokens_per_s']:9.1f} tokens/s", file=sys.stderr)
    result = {
        "benchmark": "G1",
        "workload": {
            "model": "qwen2, hidden 128, 4 layers, 4 heads, MLP 512, char vocab 19", "prompts_per_step": args.prompts,
            "group_size": args.group, "max_new_tokens": args.max_new_tokens, "steps": args.steps,
            "warmup_steps": args.warmup, "temperature": 1.0, "reward": "crc32 parity of the completion",
        },
        "m2flow_side": M2FLOW_SIDE,
        "plans": ({p: {**vars(plan_and_backend(p)[0]), "backend": plan_and_backend(p)[1]} for p in plans}
                  if M2FLOW_SIDE == "runner" else {}),
        "load_average": list(os.getloadavg()),
        "repeats": args.repeats,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "skipped": skipped,
        "failed": failed,
        "runs": {n: {str(t): rows for t, rows in per.items()} for n, per in runs.items()},
        **summarize({n: per for n, per in runs.items() if per}),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    best = result["best"]
    parts = [f"{n} {b['completions_per_s']:.1f} compl/s ({b['threads']}t)" for n, b in best.items()]
    ratios = [f"{k} {v}" for k, v in result.items() if k.endswith("_completions")]
    print(f"G1 {args.prompts}x{args.group}x{args.max_new_tokens} [{M2FLOW_SIDE}]: " + ", ".join(parts + ratios))


if __name__ == "__main__":
    main()
