"""Learning over seeds on two "your own task" paths: held-out success / accuracy after the warm start and after RL.

    python benchmarks/own_task_learning.py vla --seeds 0,1,2 --eval-seeds 20 --checkpoint 5 --threads 1 \
        policy.warm_start.epochs=3 policy.warm_start.threads=1 total_env_steps=5120 checkpoint_every=5
    python benchmarks/own_task_learning.py vla --config examples/embodied/metaworld_vla_any_task_grpo.yaml \
        --tag grpo_c4 --seeds 0,1,2 --name own_task_vla_grpo_c4 --checkpoint 30 --eval-seeds 20 --threads 1 \
        policy.warm_start.threads=1 checkpoint_every=5 algorithm.lr=0.0001 total_env_steps=24000
    python benchmarks/own_task_learning.py vla --config examples/embodied/metaworld_vla_any_task_grpo.yaml \
        --tag grpo_c4 --seeds 0,1,2 --name own_task_vla_grpo_c4_it50 --eval-seeds 20 --threads 1 \
        policy.warm_start.threads=1 checkpoint_every=5 algorithm.lr=0.0001 total_env_steps=40000 resume=auto
    python benchmarks/own_task_learning.py vla --config examples/embodied/metaworld_vla_any_task_grpo.yaml \
        --tag grpo_c4_lr5e4 --seeds 0,1,2 --name own_task_vla_grpo_c4_lr5e4 --eval-seeds 20 --threads 1 \
        policy.warm_start.threads=1 checkpoint_every=5   # the example as it is
    python benchmarks/own_task_learning.py reasoning --seeds 0,1,2 model.warm_start.threads=1 actor.num_threads=1

``vla``: a MetaWorld task outside MT10 with the product's commands alone: ``m2flow demos`` of the run
config's ``env.env_id`` (one file, made once per task, episode count and ``--demo-seed``, shared by every
seed and config), then per seed ``m2flow train CONFIG seed=S`` (``--config``, default
``examples/embodied/metaworld_vla_any_task.yaml``, PPO on handle-press-v3;
``metaworld_vla_any_task_grpo.yaml`` is the same with GRPO: the behaviour-cloning warm start of
``policy.warm_start.demos``, then RL) in ``RUN_ROOT/TAG_sS`` (``--tag``: one per setting compared), then
the success of the warm start and of one checkpoint (``--checkpoint``, default the last) on the same
held-out seeds (1,000,000 up), with greedy and with sampled action tokens, as
``benchmarks/v1_rl.py`` evaluates, but in episodes of up to ``--eval-max-steps`` (100, the length of the
example's training episodes; v1_rl plays 200) that end at success.

``reasoning``: a user's own data as three JSONL files written here once (training prompts, held-out
prompts, and ``{"prompt", "response"}`` demonstrations from an imperfect teacher who forgets carries and
borrows in 70% of its answers: the arithmetic task's own teacher, written out as a file), then per seed
``m2flow train`` of the shipped demo config with ``data.kind=file`` and ``model.warm_start.source=file``:
greedy held-out accuracy before the first GRPO iteration (the file warm start) and after the last.

Both write ``benchmarks/results/own_task_<path>.json`` after every seed (each seed's numbers, the mean and
the sample standard deviation, the commands run, the machine's load). A seed whose run finished is not trained
again, and one also evaluated is read back from its run directory: seeds may run in separate processes
(``--seeds 1 --name own_task_vla_s1``) and one call with all of them then gathers them. Extra ``key=value``
arguments override the run's config for every seed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, environment, write_result  # noqa: E402
from m2flow.driver.registry import load_workflow_config  # noqa: E402

VLA_CONFIG = "examples/embodied/metaworld_vla_any_task.yaml"
REASONING_CONFIG = "m2flow/workflows/reasoning/demo.yaml"

SEED_RESULT = "own_task_success.json"
"""A seed's measured numbers (a VLA seed's success per policy evaluated), kept in its run directory: a later call
(e.g. all seeds, after each ran in its own process) reads them instead of evaluating again."""

log = logging.getLogger("own_task_learning")


def m2flow(*args: str) -> list[str]:
    """The command line of ``m2flow ARGS`` in this interpreter."""
    return [sys.executable, "-m", "m2flow", *args]


def run(command: list[str], log_file: Path) -> float:
    """Run ``command`` from the repository root with its output in ``log_file``; its wall time in seconds."""
    log.info("$ %s  (output: %s)", " ".join(command[2:] if command[1] == "-m" else command), log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log_file.open("w") as out:
        code = subprocess.call(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} exited {code}; see {log_file}")
    return time.perf_counter() - t0


def spread(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation, min and max of the per-seed values."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def summarise(result: dict[str, Any], keys: list[str]) -> None:
    """``result["summary"][key]``: the spread of ``key`` over the seeds done so far."""
    seeds = result["seeds"]
    result["summary"] = {k: spread([s[k] for s in seeds.values()]) for k in keys if seeds}


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


# --- VLA on one MetaWorld task ---------------------------------------------------------------------------------------

def vla_task(config: str, overrides: list[str]) -> str:
    """The one MetaWorld task the VLA run's config trains on (its ``env.env_id``)."""
    task = load_workflow_config(REPO / config, overrides)[1].env.env_id
    if "," in task or not task.endswith("-v3"):
        raise SystemExit(f"{config}: env.env_id must be one MetaWorld v3 task here, got {task!r}")
    return task


def vla_seed(args: argparse.Namespace, seed: int, demos: Path, task: str) -> dict[str, Any]:
    """Train one seed (unless trained, or ``--checkpoint`` exists) and evaluate its warm start and that checkpoint."""
    import numpy as np
    import torch

    from m2flow.config.loader import load_config
    from m2flow.driver.run import CONFIG_FILE
    from m2flow.envs.metaworld import held_out_seeds
    from m2flow.envs.metaworld_demos import evaluate_success
    from m2flow.models.vla import VLAPolicy
    from m2flow.workflows.embodied.config import EmbodiedConfig
    from m2flow.workflows.embodied.warm_start import POLICY_FILE, WARM_START_DIR

    run_dir = Path(args.run_root) / f"{args.tag}_s{seed}"
    overrides = [f"seed={seed}", f"run_dir={run_dir}", f"policy.warm_start.demos={demos}", "metrics.sinks=[jsonl]",
                 *args.overrides]
    command = m2flow("train", args.config, *overrides)
    wanted = None if args.checkpoint == "last" else run_dir / "checkpoints" / f"step_{int(args.checkpoint):06d}"
    train_s = None
    rows = metrics_rows(run_dir)
    total = load_workflow_config(REPO / args.config, overrides)[1].total_env_steps
    trained_to_end = bool(rows) and rows[-1].get("env/total_steps", 0) >= total
    if not trained_to_end and not (wanted is not None and wanted.is_dir()):
        train_s = run(command, run_dir.with_suffix(".log"))
    checkpoint = wanted or sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    cfg = load_config(EmbodiedConfig, checkpoint / CONFIG_FILE)
    env_kwargs = {k: v for k, v in cfg.env.env_kwargs.items() if k in ("height", "width", "camera", "proprio")}
    env_kwargs["max_episode_steps"] = args.eval_max_steps
    seeds = held_out_seeds(args.eval_seeds, args.eval_offset)
    torch.set_num_threads(args.threads)
    policy = VLAPolicy(cfg.policy.vla, action_dim=4).eval()
    generator = torch.Generator()
    # Each policy's success, kept as it is measured ("warm_start/greedy", "step_000010/sampled", ...): a later
    # call, or one evaluating another checkpoint, reuses what was measured with the same evaluation settings.
    cache_file = run_dir / SEED_RESULT
    protocol = {"eval_seeds": args.eval_seeds, "max_episode_steps": args.eval_max_steps,
                "sample_seed": args.sample_seed, "parallel": args.parallel}
    if args.eval_offset:  # another set of held-out seeds (absent from the protocol of the first set)
        protocol["eval_offset"] = args.eval_offset
    cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    if cache.get("protocol") != protocol:
        cache = {"protocol": protocol, "success": {}}

    def success(name: str, weights_file: Path, greedy: bool) -> float:
        key = f"{name}/{'greedy' if greedy else 'sampled'}"
        if key in cache["success"]:
            return cache["success"][key]
        state = torch.load(weights_file, map_location="cpu", weights_only=True)["policy"]
        policy.load_state_dict(state)
        generator.manual_seed(args.sample_seed)  # every policy sees the same sampling stream

        def act(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return policy.act(torch.from_numpy(obs), deterministic=greedy, generator=generator).actions.numpy()

        t0 = time.perf_counter()
        cache["success"][key] = evaluate_success(act, [task], seeds, env_kwargs, parallel=args.parallel)[task]
        log.info("seed %d: %s success %.2f (%.0f s)", seed, key, cache["success"][key], time.perf_counter() - t0)
        cache_file.write_text(json.dumps(cache, indent=1))
        return cache["success"][key]

    warm = run_dir / WARM_START_DIR / POLICY_FILE
    rows = metrics_rows(run_dir)
    step = int(checkpoint.name.split("_")[-1])
    bc_rows = [json.loads(line) for line in (run_dir / "warm_start.jsonl").read_text().splitlines() if line.strip()]
    return {
        "command": " ".join(["m2flow", *command[3:]]), "train_wall_s": train_s, "checkpoint": checkpoint.name,
        "env_steps": step * cfg.rollout_steps * cfg.env.num_envs * cfg.policy.action_chunk,  # at most
        "bc_loss": [r["warm_start/loss"] for r in bc_rows],
        "train_success_rate": [r.get("env/success_rate") for r in rows],
        # sampled first: their episodes mostly end early at success, and they are the pair that moves
        "bc_sampled": success("warm_start", warm, False),
        "rl_sampled": success(checkpoint.name, checkpoint / "actor.pt", False),
        "bc_greedy": success("warm_start", warm, True),
        "rl_greedy": success(checkpoint.name, checkpoint / "actor.pt", True),
        "all_evaluated": cache["success"],
    }


def vla(args: argparse.Namespace) -> None:
    task = vla_task(args.config, args.overrides)
    demos = Path(args.run_root) / f"demos_{task}_{args.demo_episodes}ep_seed{args.demo_seed}.npz"
    demos_command = m2flow("demos", task, "--episodes", str(args.demo_episodes), "--seed", str(args.demo_seed),
                           "--image-size", "64", "-o", str(demos))
    result: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "config": args.config, "task": task,
                              "demos": {"command": " ".join(["m2flow", *demos_command[3:]]), "seed": args.demo_seed,
                                        "shared_by_all_seeds": True},
                              "eval": {"held_out_seeds": args.eval_seeds, "first_seed": 1_000_000 + args.eval_offset,
                                       "max_episode_steps": args.eval_max_steps, "ends_at_success": True,
                                       "sample_seed": args.sample_seed},
                              "environment": environment(), "seeds": {}}
    if not demos.is_file():
        result["demos"]["wall_s"] = run(demos_command, demos.with_suffix(".log"))
    for seed in args.seeds:
        result["seeds"][str(seed)] = vla_seed(args, seed, demos, task)
        result["environment_end"] = environment()
        summarise(result, ["bc_greedy", "bc_sampled", "rl_greedy", "rl_sampled"])
        path = write_result(args.name or "own_task_vla", result)
        log.info("seed %d: %s -> %s", seed, {k: v for k, v in result["seeds"][str(seed)].items()
                                              if k.startswith(("bc_g", "bc_s", "rl_"))}, path)


# --- reasoning from a JSONL warm start ----------------------------------------------------------------------------

def write_user_files(root: Path, slip_rate: float) -> dict[str, str]:
    """The user's files: training and held-out prompts with answers, and teacher demonstrations of the training ones."""
    from m2flow.data import ArithmeticTask

    root.mkdir(parents=True, exist_ok=True)
    # The demo's task: 2-digit sums and differences, operands padded, answers least significant digit first.
    task = ArithmeticTask(digits=2, operators=("+", "-"), reverse_answer=True, pad_operands=True)
    train, test = task.sample("train", 8000, seed=0), task.sample("test", 400, seed=0)
    demos = [{"prompt": d["prompt"], "response": d["answer"]} for d in task.demonstrations(train, slip_rate, seed=0)]
    files = {"train": train, "test": test, "demos": demos}
    for name, records in files.items():
        if not (root / f"{name}.jsonl").is_file():  # a run of another seed may be reading it
            (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    wrong = sum(d["response"] != t["answer"] for d, t in zip(demos, train))
    return {**{name: str(root / f"{name}.jsonl") for name in files}, "demos_wrong_fraction": wrong / len(demos)}


def reasoning_seed(args: argparse.Namespace, seed: int, files: dict[str, Any]) -> dict[str, Any]:
    run_dir = Path(args.run_root) / f"reasoning_s{seed}"
    overrides = [f"seed={seed}", f"run_dir={run_dir}", "data.kind=file", f"data.path={files['train']}",
                 f"data.eval_path={files['test']}", "model.warm_start.source=file",
                 f"model.warm_start.file={files['demos']}", "metrics.sinks=[jsonl]", *args.overrides]
    command = m2flow("train", REASONING_CONFIG, *overrides)
    if (run_dir / SEED_RESULT).is_file():
        return json.loads((run_dir / SEED_RESULT).read_text())
    steps = load_workflow_config(REPO / REASONING_CONFIG, overrides)[1].steps
    train_s = None
    if not any(r["step"] >= steps and "eval/accuracy" in r for r in metrics_rows(run_dir)):  # no final evaluation yet
        train_s = run(command, run_dir.with_suffix(".log"))
    rows = metrics_rows(run_dir)
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    started = json.loads((run_dir / "warm_start.jsonl").read_text().splitlines()[0])["time"]
    out = {"command": " ".join(["m2flow", *command[3:]]), "train_wall_s": train_s, "eval_curve": evals,
           "first_warm_start_step_to_end_s": rows[-1]["time"] - started,
           "reward_first_last": [rewards[0], rewards[-1]] if rewards else None,
           "warm_start_accuracy": evals[0][1], "grpo_accuracy": evals[-1][1]}
    (run_dir / SEED_RESULT).write_text(json.dumps(out, indent=1))
    return out


def reasoning(args: argparse.Namespace) -> None:
    files = write_user_files(Path(args.run_root) / "reasoning_data", args.slip_rate)
    result: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "config": REASONING_CONFIG,
                              "files": files, "environment": environment(), "seeds": {}}
    for seed in args.seeds:
        result["seeds"][str(seed)] = reasoning_seed(args, seed, files)
        result["environment_end"] = environment()
        summarise(result, ["warm_start_accuracy", "grpo_accuracy"])
        path = write_result(args.name or "own_task_reasoning", result)
        log.info("seed %d: %s -> %s", seed, result["seeds"][str(seed)]["eval_curve"], path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", choices=("vla", "reasoning"))
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the run's config, for every seed")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--run-root", default=str(REPO / "runs" / "own_task"))
    parser.add_argument("--name", default="", help="results file name (default own_task_<path>)")
    vla_opts = parser.add_argument_group("vla")
    vla_opts.add_argument("--config", default=VLA_CONFIG, help="the run's config (its env.env_id: the task)")
    vla_opts.add_argument("--tag", default="vla", help="run directories RUN_ROOT/TAG_sSEED: one tag per setting")
    vla_opts.add_argument("--demo-episodes", type=int, default=50)
    vla_opts.add_argument("--demo-seed", type=int, default=0)
    vla_opts.add_argument("--eval-seeds", type=int, default=20, help="held-out seeds, the same for every policy")
    vla_opts.add_argument("--eval-offset", type=int, default=0,
                          help="the held-out seeds start at 1,000,000 + this: another set than the default one")
    vla_opts.add_argument("--checkpoint", default="last", help="the RL checkpoint evaluated: 'last' or its iteration")
    vla_opts.add_argument("--eval-max-steps", type=int, default=100,
                          help="evaluation episode length (the example's training episodes: 100)")
    vla_opts.add_argument("--sample-seed", type=int, default=0, help="the sampling generator's seed (sampled tokens)")
    vla_opts.add_argument("--parallel", type=int, default=20, help="evaluation episodes run side by side")
    vla_opts.add_argument("--threads", type=int, default=2, help="torch threads of the evaluation")
    parser.add_argument("--slip-rate", type=float, default=0.7, help="reasoning: the teacher's slip rate in the file")
    args = parser.parse_intermixed_args()  # overrides may follow the options
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    (vla if args.path == "vla" else reasoning)(args)


if __name__ == "__main__":
    main()
