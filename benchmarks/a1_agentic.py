"""Benchmark A1: agentic multi-turn GRPO with a tool on a tiny LM, m2flow vs TRL, side by side.

Both sides train the same warm-started 2-layer Qwen2 (hidden 64, character tokenizer; the workflow's own
warm start on the imperfect teacher, made once and reused) on the calculator task
(``m2flow/envs/text/calculator.py``: 3-digit x 3-digit products; the model calls
``<tool>calculator: A*B</tool>``, reads ``<result>P</result>`` and answers; reward 1.0 for the exact
product), with GRPO: the same problems in the same order, ``groups_per_step`` groups of ``group_size``
episodes per step, at most ``max_turns`` model turns (so ``max_turns - 1`` tool calls), ``max_tokens``
response tokens per episode (model and tool tokens together) and ``max_turn_tokens`` per turn, sampling at
temperature 1, AdamW at the same learning rate with gradient clipping 1.0, PPO clip 0.2, no KL, one
optimizer step per batch, tool tokens out of the loss. A model turn ends at end-of-sequence on both
sides (TRL's rule; the m2flow side runs with ``rollout.stop=[]``), so an episode is the same token
sequence on both sides.

- ``m2flow:PLAN``: the agentic workflow (``m2flow/workflows/agentic``) under each plan of ``PLANS``;
- ``trl:SETTING``: TRL's ``GRPOTrainer`` with its own tool loop (``benchmarks/peers/trl_agentic.py``, its
  own virtual environment, ``--setup``), under each setting of ``TRL_SETTINGS``.

``--latency SPEC`` (YAML, a ``tool_latency_s`` of ``m2flow/rewards/tools/latency.py``, e.g. ``{dist: lognormal,
median_s: 0.02, sigma: 1.5, max_s: 0.5}``) makes every tool call on every side first wait a time drawn from
that distribution: a tool that answers over a network. The m2flow sides take it as
``env.kwargs.tool_latency_s`` (each episode's waits drawn from the episode's seed), the TRL sides as the peer's
``--tool-latency`` (one generator seeded with the run's seed, in call order: TRL's tool call carries no
episode seed), so both sides wait from the same distribution but not the same individual waits. Without it
the tool answers at once.

Every run is a fresh process at ``T`` torch threads (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` set to T
and ``torch.set_num_threads(T)`` in every process that computes: TRL's, and each m2flow worker's through
``rollout/actor/env.num_threads``). Rounds alternate the sides (A B C A B C ...); round r trains with seed
r on every side (sampling; the problems are the same), so the rounds are also the seeds of the learning
comparison. Throughput: trajectories and model-generated tokens (tool tokens not counted) per second of
the training loop, from the end of the warm-up steps (``--warmup-steps``, 1 by default: a compiled
decoding step compiles in the first step) to the end of the last (all turns' generation, tool calls,
rewards, loss, backward, optimizer step, weight sync, logging); process start, imports, model loading,
Ray and worker start-up, the warm-up steps (their time is reported) and the evaluation are not in it. Learning: held-out accuracy
after the run (the same number of trajectories on every side), measured by one evaluator for all (the
episode engine of ``m2flow/workers/agentic``, sampled at temperature 1 on the same fresh ``test``-split
problems) on each side's saved final weights.

    python benchmarks/a1_agentic.py --setup          # the TRL environment: benchmarks/.venvs/trl-a1
    python benchmarks/a1_agentic.py                  # 40 steps of 8 x 4, 3 rounds, every plan, 1 thread
    python benchmarks/a1_agentic.py --plans local --trl whole --rounds 1 --steps 5   # a quick check
    python benchmarks/a1_agentic.py --plans local,local_concurrent --trl whole,async_tool \\
        --latency "{dist: lognormal, median_s: 0.02, sigma: 1.5, max_s: 0.5}"       # a long-tail tool

Writes ``benchmarks/results/a1.json`` (or ``--out``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRL_VENV = HERE / ".venvs" / "trl-a1"
TRL_PACKAGES = ["torch==2.13.0", "transformers==5.24.0", "trl==1.16.0", "accelerate", "datasets", "requests"]
EXAMPLE = ROOT / "examples" / "agentic" / "calculator_grpo.yaml"
EVAL_SEED = 2_000_000_011
"""First seed of the held-out problems of the common evaluation."""


@dataclass(frozen=True)
class M2flowPlan:
    """One execution plan of the agentic workflow on this machine."""

    placement: str
    overrides: tuple[str, ...] = ()
    max_threads: int | None = None
    """Most torch threads per worker worth trying (plans that keep two processes busy fill both cores at 1)."""


PLANS = {
    # Env, rollout and actor as objects in one process (no Ray): the serial mode.
    "local": M2flowPlan("local"),
    # The same without a deadline on each environment step (TRL's tool calls have none either): the steps
    # run in the env worker's own thread (no hand-off per batch), but a hung environment hangs the run.
    "local_nodeadline": M2flowPlan("local", ("env.step_timeout_s=null",)),
    # Ray, everything on device 0: rollout and actor processes take turns; the environments live in the
    # rollout's process (no messages per turn).
    "collocated": M2flowPlan("env,rollout,actor: 0", ("env.fuse_with_rollout=true",), max_threads=1),
    # Ray, env workers apart on device 1, rollout and actor taking turns on device 0: every turn's
    # actions and observations travel between processes.
    "env_apart": M2flowPlan("env: 1, rollout,actor: 0", max_threads=1),
    # Ray, environments in the rollout's process on device 0, actor on device 1: the actor trains the
    # groups that have ended while the rest of the iteration is still being played.
    "split": M2flowPlan("env,rollout: 0, actor: 1", ("env.fuse_with_rollout=true",), max_threads=1),
    # The same with bounded staleness 1: the next step's episodes are played while the actor trains.
    "split_s1": M2flowPlan("env,rollout: 0, actor: 1", ("env.fuse_with_rollout=true", "algorithm.max_staleness=1"),
                           max_threads=1),
    # split_s1 with each Ray rank's process pinned to its device's core (cluster.pin_cpus): the rollout and
    # the actor never share a core or move between them.
    "split_s1_pin": M2flowPlan("env,rollout: 0, actor: 1", ("env.fuse_with_rollout=true", "algorithm.max_staleness=1",
                                                            "cluster.pin_cpus=true"),
                               max_threads=1),
    # The same with bounded staleness 2: the rollout may run two steps ahead of the actor, so neither waits
    # for the other's jitter.
    "split_s2": M2flowPlan("env,rollout: 0, actor: 1", ("env.fuse_with_rollout=true", "algorithm.max_staleness=2"),
                           max_threads=1),
    # split_s1 with each decoding step of the rollout torch.compile'd (it compiles in the first step).
    "split_s1_compile": M2flowPlan("env,rollout: 0, actor: 1", ("env.fuse_with_rollout=true", "algorithm.max_staleness=1",
                                                                "rollout.compile=true"), max_threads=1),
    # One process, each decoding step of the rollout torch.compile'd (it compiles in the first step).
    "local_compile": M2flowPlan("local", ("rollout.compile=true",), max_threads=1),
    # One process with bounded staleness 1: the rollout plays the next step's episodes behind the weights
    # by at most one step while the actor trains on this step's (the two otherwise take turns).
    "local_s1": M2flowPlan("local", ("algorithm.max_staleness=1",)),
    # The same with the actor's packed training forward (each group's shared prompt run once, no padding
    # inside a group).
    "local_fast": M2flowPlan("local", ("rollout.compile=true", "actor.forward=packed"), max_threads=1),
    # One process, each turn's environment steps side by side, a thread each: with --latency the tool calls
    # of a turn wait together instead of one after another.
    "local_concurrent": M2flowPlan("local", ("env.concurrent=true",)),
    # For a tool with latency (--latency): four env workers apart, each stepping its episodes side by side,
    # rollout and actor on device 0, staleness 2 (A1-long-tail's plan, on 8 logical devices over the cores) ...
    "tail_apart_s2": M2flowPlan("env: 1-4, rollout,actor: 0", ("cluster.cpu_devices_per_node=8", "env.concurrent=true",
                                                               "algorithm.max_staleness=2"), max_threads=1),
    # ... with partial rollouts (an iteration takes the groups that finished; the others go on in the next) and
    # async steps (a turn round takes the tool answers that came and plays on).
    "tail_partial_async_s2": M2flowPlan("env: 1-4, rollout,actor: 0", (
        "cluster.cpu_devices_per_node=8", "env.concurrent=true", "algorithm.max_staleness=2", "rollout.partial=true",
        "env.async_steps=true"), max_threads=1),
}


@dataclass(frozen=True)
class TrlSetting:
    """One setting of the TRL peer (peer script arguments)."""

    args: tuple[str, ...] = ()


TRL_SETTINGS = {
    "whole": TrlSetting(),                            # the step's 32 completions in one forward/backward
    "mb16": TrlSetting(("--micro-batch", "16")),      # two micro-batches of 16 (as the m2flow side's actor)
    "cb": TrlSetting(("--continuous-batching",)),     # transformers' continuous-batching generation
    # The tool as a coroutine function, TRL's async tools (they matter only with --latency): TRL 1.16 gathers
    # the calls of one completion on its event loop but takes the completions one after another.
    "async_tool": TrlSetting(("--async-tool",)),
}


@dataclass
class Side:
    """One contender at one thread count: its command (seed and save dir appended per run)."""

    name: str
    threads: int
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------- preparation


def setup() -> None:
    """Create the TRL peer's virtual environment and install its pinned packages."""
    py = TRL_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *TRL_PACKAGES], check=True)
    print(f"trl peer ready in {TRL_VENV}")


def warm_start(run_dir: Path, threads: int) -> Path:
    """The example's tiny model and warm start (1500 supervised steps on the imperfect teacher), made once
    under ``run_dir`` by the workflow's own functions and reused while their settings match."""
    import torch

    from m2flow.config.loader import load_config
    from m2flow.workflows.agentic.config import AgenticConfig
    from m2flow.workflows.agentic.warm_start import prepare_model, warm_start_model

    torch.set_num_threads(threads)
    cfg = load_config(AgenticConfig, EXAMPLE, [f"model.path={run_dir / 'tiny-agentic'}", f"run_dir={run_dir}",
                                               f"model.warm_start.threads={threads}"])
    return warm_start_model(cfg, prepare_model(cfg.model))


def make_workload(args: argparse.Namespace, model_dir: Path, workdir: Path) -> Path:
    """workload.json: the model, the problems in play order (one per group) and the shared settings."""
    from m2flow.envs.text.calculator import draw_problem, problem_text

    problems = []
    for k in range(args.steps * args.groups):  # the m2flow side resets group k of the run with seed k
        a, b = draw_problem(k, args.digits, "train")
        problems.append({"prompt": problem_text(a, b), "answer": str(a * b)})
    workload = {
        "model_dir": str(model_dir.resolve()), "problems": problems, "steps": args.steps,
        "groups_per_step": args.groups, "group_size": args.group, "digits": args.digits,
        "max_turns": args.max_turns, "max_tokens": args.max_tokens, "max_turn_tokens": args.max_turn_tokens,
        "warmup_steps": args.warmup_steps, "temperature": 1.0, "lr": args.lr, "grad_clip": 1.0, "clip": 0.2,
        "tool_latency_s": args.latency,  # None: the tool answers at once
    }
    path = workdir / "workload.json"
    path.write_text(json.dumps(workload))
    return path


def sides(workload: Path, threads: int, plans: list[str], trl: list[str]) -> list[Side]:
    """The contenders at one thread count (plans that cannot use ``threads`` are left out)."""
    out = []
    me = [sys.executable, str(Path(__file__).resolve()), "--m2flow-side", "--workload", str(workload),
          "--threads", str(threads)]
    for plan in plans:
        limit = PLANS[plan].max_threads
        if limit is None or threads <= limit:
            out.append(Side(f"m2flow:{plan}", threads, [*me, "--plan", plan]))
    peer = [str(TRL_VENV / "bin" / "python"), str(HERE / "peers" / "trl_agentic.py"), "--workload", str(workload),
            "--threads", str(threads)]
    latency = json.loads(workload.read_text()).get("tool_latency_s")
    if latency is not None:
        peer += ["--tool-latency", json.dumps(latency)]
    for name in trl:
        out.append(Side(f"trl:{name}", threads, [*peer, *TRL_SETTINGS[name].args]))
    return out


def run_side(side: Side, seed: int, save: Path, timeout: float) -> dict[str, Any]:
    """One run in a fresh process; its JSON line."""
    t = str(side.threads)
    env = dict(os.environ, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, TOKENIZERS_PARALLELISM="false",
               RAY_AUTH_MODE="disabled", TRL_EXPERIMENTAL_SILENCE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [*side.command, "--seed", str(seed), "--save", str(save)]
    for _ in range(3):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        # On a heavily loaded machine Ray's node can miss its fixed start-up deadline: try again.
        if "timed out during startup" not in proc.stderr:
            break
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{side.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- the common evaluation


def evaluate(model_dir: Path, w: dict[str, Any], episodes: int, threads: int) -> dict[str, float]:
    """Held-out accuracy of the weights in ``model_dir``: ``episodes`` fresh test-split problems, played by
    the episode engine with the training budgets, sampled at temperature 1 (the same seeds every call)."""
    import torch

    from m2flow.backends.generation.lean import LeanGenerationBackend
    from m2flow.envs.text import TextEnvBatch
    from m2flow.models.causal_lm import load_model_and_tokenizer
    from m2flow.workers.agentic import EpisodeConfig, run_episodes

    torch.set_num_threads(threads)
    model, tokenizer = load_model_and_tokenizer(str(model_dir))
    model.eval()
    backend = LeanGenerationBackend(model, tokenizer)
    envs = TextEnvBatch.from_registry("calculator", episodes, env_kwargs={
        "digits": w["digits"], "split": "test", "tools": True, "max_calls": w["max_turns"] - 1})
    cfg = EpisodeConfig(max_turns=w["max_turns"], max_tokens=w["max_tokens"], max_turn_tokens=w["max_turn_tokens"],
                        temperature=1.0, stop=(), seed=EVAL_SEED)
    seeds = list(range(EVAL_SEED, EVAL_SEED + episodes))
    trajs, stats = run_episodes(backend, tokenizer, envs, seeds, list(range(episodes)), cfg)
    return {"accuracy": sum(t.reward for t in trajs) / episodes,
            "tool_calls_per_episode": sum(stats.tool_outcomes.values()) / episodes,
            "turns_mean": stats.turns / episodes}


# ----------------------------------------------------------------------------- the m2flow side


def m2flow_side(workload: str, threads: int, plan_name: str, seed: int, save: str | None) -> dict[str, Any]:
    """The agentic workflow on the workload under ``PLANS[plan_name]``; its figures (and final weights in ``save``)."""
    import torch

    from m2flow.config.loader import load_config
    from m2flow.workflows.agentic.config import AgenticConfig
    from m2flow.autoplan.entry import train
    from m2flow.workflows.agentic.workflow import WORKFLOW as AGENTIC

    torch.set_num_threads(threads)
    w = json.loads(Path(workload).read_text())
    plan = PLANS[plan_name]
    steps = w["steps"]
    # JSON is YAML: the spec goes in as the override's value as it is.
    spec = w.get("tool_latency_s")
    latency = [] if spec is None else [f"env.kwargs.tool_latency_s={json.dumps(spec)}"]
    with tempfile.TemporaryDirectory(prefix="a1-m2flow-") as run_dir:
        cfg = load_config(AgenticConfig, EXAMPLE, [
            f"placement={plan.placement}", f"model.path={w['model_dir']}", "model.create_tiny=false",
            "model.warm_start.steps=0", f"run_dir={run_dir}", f"seed={seed}", f"steps={steps}", "eval_every=0",
            f"checkpoint_every={steps}", "keep_checkpoints=1", "metrics.sinks=[jsonl]",
            f"episodes.groups_per_step={w['groups_per_step']}", f"episodes.group_size={w['group_size']}",
            "episodes.seed_offset=0", f"env.kwargs.digits={w['digits']}", f"env.kwargs.max_calls={w['max_turns'] - 1}",
            # A turn ends at end-of-sequence, as in TRL (no stop string): the same token sequences on both sides.
            "rollout.stop=[]", f"rollout.max_turns={w['max_turns']}", f"rollout.max_tokens={w['max_tokens']}",
            f"rollout.max_turn_tokens={w['max_turn_tokens']}", f"rollout.temperature={w['temperature']}",
            f"actor.optim.lr={w['lr']}", f"actor.optim.grad_clip={w['grad_clip']}",
            f"algorithm.clip_low={w['clip']}",
            f"rollout.num_threads={threads}", f"actor.num_threads={threads}", f"env.num_threads={threads}",
            *latency, *plan.overrides])
        ends: list[tuple[float, float]] = []

        def watch(it: int, metrics: dict[str, float]) -> bool:
            ends.append((time.perf_counter(), metrics["time/step"]))
            return False

        history = train(AGENTIC, cfg, None, watch).history
        if save:
            actor = sorted(Path(run_dir).glob("**/actor/config.json"), key=lambda p: p.stat().st_mtime)[-1].parent
            shutil.copytree(actor, save, dirs_exist_ok=True)
    # From the first timed step's start to the last step's end: after the workload's warm-up steps (a
    # compiled decoding step compiles in the first), else from the first step's start.
    k = w.get("warmup_steps", 0)
    seconds = ends[-1][0] - (ends[k - 1][0] if k else ends[0][0] - ends[0][1])
    trajectories = sum(h["rollout/responses_count"] for h in history[k:])
    tokens = sum(h["rollout/model_tokens"] for h in history[k:])
    rewards = [h["reward/mean"] for h in history]
    return {
        "side": f"m2flow:{plan_name}", "placement": plan.placement, "overrides": list(plan.overrides),
        "threads": threads, "steps": len(history), "warmup_steps": k,
        "warmup_seconds": ends[k - 1][0] - (ends[0][0] - ends[0][1]) if k else 0.0, "seconds": seconds, "trajectories": trajectories,
        "generated_tokens": tokens, "trajectories_per_s": trajectories / seconds, "tokens_per_s": tokens / seconds,
        "seconds_per_step_median": statistics.median(h["time/step"] for h in history),
        "train_reward_first": rewards[0], "train_reward_last": rewards[-1],
        "train_reward_mean": sum(rewards) / len(rewards), "train_rewards": rewards,
    }


# ----------------------------------------------------------------------------- driver


def summarize(runs: dict[str, list[dict[str, Any]]], baseline: dict[str, float]) -> dict[str, Any]:
    """Medians per side, each system's fastest side, the ratio between them and the learning figures."""
    out: dict[str, Any] = {"sides": {}}
    for name, rows in runs.items():
        if not rows:
            continue
        acc = [r["eval"]["accuracy"] for r in rows]
        out["sides"][name] = {
            "rounds": len(rows),
            "trajectories_per_s": round(statistics.median(r["trajectories_per_s"] for r in rows), 2),
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rows), 1),
            "seconds": round(statistics.median(r["seconds"] for r in rows), 3),
            "accuracy_mean": round(sum(acc) / len(acc), 4), "accuracy_by_round": acc,
        }
    best = {}
    for system in ("m2flow", "trl"):
        mine = [n for n in out["sides"] if n.startswith(system + ":")]
        if mine:
            best[system] = max(mine, key=lambda n: out["sides"][n]["trajectories_per_s"])
    out["best"] = best
    out["warm_start_eval"] = baseline
    if len(best) == 2:
        m, t = out["sides"][best["m2flow"]], out["sides"][best["trl"]]
        out["ratio_trajectories"] = round(m["trajectories_per_s"] / t["trajectories_per_s"], 3)
        out["ratio_tokens"] = round(m["tokens_per_s"] / t["tokens_per_s"], 3)
        # Paired per round (the two sides ran minutes apart in the same round): the spread of the ratio.
        paired = [a["trajectories_per_s"] / b["trajectories_per_s"]
                  for a, b in zip(runs[best["m2flow"]], runs[best["trl"]])]
        out["ratio_trajectories_by_round"] = [round(x, 3) for x in paired]
        out["accuracy_difference"] = round(m["accuracy_mean"] - t["accuracy_mean"], 4)
    return out


def latency_spec(text: str, ap: argparse.ArgumentParser) -> Any:
    """``--latency``'s YAML as plain data (what the workload carries to every side), checked here so that a bad
    spec fails before any run."""
    from m2flow.config.errors import ConfigError
    from m2flow.config.yaml_io import parse_yaml
    from m2flow.rewards.tools.latency import parse_latency

    try:
        spec = parse_yaml(text, source=repr(text))
        parse_latency(spec)
    except (ConfigError, ValueError, TypeError) as e:
        ap.error(f"--latency: {e}")
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true", help="create the TRL environment and exit")
    ap.add_argument("--m2flow-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--plan", default="local", help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=40, help="GRPO steps per run")
    ap.add_argument("--groups", type=int, default=8, help="groups (problems) per step")
    ap.add_argument("--group", type=int, default=4, help="episodes per group")
    ap.add_argument("--digits", type=int, default=3, help="digits of each operand")
    ap.add_argument("--max-turns", type=int, default=3, help="model turns per episode (tool calls: one fewer)")
    ap.add_argument("--max-tokens", type=int, default=96, help="response tokens per episode, tool tokens included")
    ap.add_argument("--max-turn-tokens", type=int, default=40, help="tokens per model turn")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=1,
                    help="first steps of each run left out of the timing on every side (compiling, first allocations)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; round r trains with seed r on every side")
    ap.add_argument("--threads", default="1",
                    help="comma-separated torch thread counts (2 starves on a shared 2-core machine)")
    ap.add_argument("--plans", default=",".join(PLANS), help=f"m2flow plans: {', '.join(PLANS)}")
    ap.add_argument("--trl", default="whole,mb16", help=f"TRL settings: {', '.join(TRL_SETTINGS)}")
    ap.add_argument("--eval-episodes", type=int, default=400, help="held-out episodes per evaluation")
    ap.add_argument("--warm-start-dir", default=str(ROOT / "runs" / "a1"), help="where the warm start is kept")
    ap.add_argument("--latency", default=None,
                    help="every tool call first waits a time drawn from this tool_latency_s (YAML), on every side, "
                         "e.g. '{dist: lognormal, median_s: 0.02, sigma: 1.5, max_s: 0.5}' (default: no wait)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed for one run")
    ap.add_argument("--out", default=str(HERE / "results" / "a1.json"))
    args = ap.parse_args()
    if args.setup:
        setup()
        return
    if args.m2flow_side:
        print(json.dumps(m2flow_side(args.workload, int(args.threads), args.plan, args.seed, args.save)))
        return
    plans = [p for p in args.plans.split(",") if p]
    trl = [s for s in args.trl.split(",") if s]
    for p in plans:
        if p not in PLANS:
            ap.error(f"unknown plan {p!r}; valid: {', '.join(PLANS)}")
    for s in trl:
        if s not in TRL_SETTINGS:
            ap.error(f"unknown TRL setting {s!r}; valid: {', '.join(TRL_SETTINGS)}")
    if trl and not (TRL_VENV / "bin" / "python").exists():
        ap.error(f"no {TRL_VENV}; run with --setup first")
    if args.latency is not None:
        args.latency = latency_spec(args.latency, ap)
    thread_counts = [int(t) for t in args.threads.split(",")]
    eval_threads = min(thread_counts)
    loads = [os.getloadavg()[0]]
    model_dir = warm_start(Path(args.warm_start_dir), eval_threads)
    runs: dict[str, list[dict[str, Any]]] = {}
    failed: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="a1-") as tmp:
        workload = make_workload(args, model_dir, Path(tmp))
        w = json.loads(workload.read_text())
        baseline = evaluate(model_dir, w, args.eval_episodes, eval_threads)
        print(f"  warm start: held-out accuracy {baseline['accuracy']:.3f}", file=sys.stderr, flush=True)
        contenders = [s for t in thread_counts for s in sides(workload, t, plans, trl)]
        for r in range(args.rounds):
            for side in contenders:
                key = f"{side.name}@{side.threads}t"
                save = Path(tmp) / f"{key.replace(':', '-').replace('@', '-')}-r{r}"
                try:
                    row = run_side(side, r, save, args.timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as e:  # keep the other sides' figures
                    failed.setdefault(key, []).append(f"round {r}: {str(e)[-1500:]}")
                    print(f"  round {r} {key} FAILED", file=sys.stderr, flush=True)
                    continue
                row["eval"] = evaluate(save, w, args.eval_episodes, eval_threads)
                row["load_1m"] = os.getloadavg()[0]
                loads.append(row["load_1m"])
                shutil.rmtree(save, ignore_errors=True)
                runs.setdefault(key, []).append(row)
                print(f"  round {r} {key:24s} {row['trajectories_per_s']:7.1f} traj/s {row['tokens_per_s']:8.0f} tok/s "
                      f"{row['seconds']:6.2f}s  held-out {row['eval']['accuracy']:.3f}  load {row['load_1m']:.1f}",
                      file=sys.stderr, flush=True)
    result = {
        "benchmark": "A1",
        "workload": {k: v for k, v in w.items() if k not in ("problems", "model_dir")} | {
            "model": "qwen2, hidden 64, 2 layers, 4 heads (2 kv), MLP 128, character tokenizer",
            "warm_start": "examples/agentic/calculator_grpo.yaml model.warm_start (1500 steps, teacher 70% right)",
            "task": "calculator, 3-digit x 3-digit, train split; eval: test split, sampled at temperature 1",
            "eval_episodes": args.eval_episodes, "turn_end": "end-of-sequence on both sides"},
        "plans": {p: {"placement": PLANS[p].placement, "overrides": list(PLANS[p].overrides)} for p in plans},
        "trl_settings": {s: list(TRL_SETTINGS[s].args) for s in trl},
        "threads": thread_counts, "rounds": args.rounds,
        "load_average_1m": {"min": min(loads), "max": max(loads), "at_end": list(os.getloadavg())},
        "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "failed": failed, "runs": runs, **summarize(runs, baseline),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    parts = [f"{n} {s['trajectories_per_s']:.1f} traj/s acc {s['accuracy_mean']:.3f}"
             for n, s in result["sides"].items()]
    ratio = f"; best m2flow / best TRL {result['ratio_trajectories']}x" if "ratio_trajectories" in result else ""
    tool = f", tool latency {json.dumps(args.latency)}" if args.latency else ""
    print(f"A1 {args.groups}x{args.group} x {args.steps} steps{tool}: " + ", ".join(parts) + ratio)


if __name__ == "__main__":
    main()
