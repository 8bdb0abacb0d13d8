"""The demo's control study, through the reasoning workflow: GRPO vs more supervised steps vs a random reward.

Per seed, three arms from the demo's config (``m2flow/workflows/reasoning/demo.yaml``):

- ``grpo``: the demo itself (warm start, then GRPO rewarded for the exact answer);
- ``sft_more``: the warm start given as many more supervised steps as GRPO samples responses
  (60 x 32 x 8 = 15,360 demonstrations = 120 steps of 128), then evaluated (``steps=1``: the
  held-out evaluation before the first iteration is the one read);
- ``random_reward``: the demo's GRPO phase from the same warm start (copied from the ``grpo`` arm's
  run directory, so the workflow reuses it) with a reward that ignores the response: 1.0 with
  probability 0.2. Same compute and updates, no information.

    python benchmarks/demo_control_study.py --seeds 0,1,2 --out runs/demo_study
    python benchmarks/demo_control_study.py --table runs/demo_study
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import statistics
from pathlib import Path
from typing import Any

log = logging.getLogger("demo_control_study")

ARMS = ("grpo", "sft_more", "random_reward")
RANDOM_REWARD_RATE = 0.2
REWARD_PATH = "benchmarks.demo_control_study:coin_reward"
"""How the workers import the random reward (the repository root is on their PYTHONPATH)."""
_coin = random.Random(0)


def coin_reward(response: str, reference: str) -> float:
    """1.0 with probability RANDOM_REWARD_RATE, whatever the response: a reward without information."""
    return float(_coin.random() < RANDOM_REWARD_RATE)


def _accuracies(run_dir: Path) -> list[tuple[int, float]]:
    from m2flow.workflows.reasoning.demo import eval_points

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    history = [r for r in rows if "reward/mean" in r]
    final = [r for r in rows if "reward/mean" not in r and "eval/accuracy" in r]
    if final and history:  # the final evaluation is its own row in the JSONL; the history merges it
        history[-1] = {**history[-1], **final[-1]}
    return eval_points(history)


def cfg_reward(overrides: list[str]) -> str:
    """The demo's training reward (under ``overrides``): the random arm's held-out evaluation uses it."""
    from m2flow.workflows.reasoning.demo import load_demo_config

    return load_demo_config(overrides).reward.fn


def run_seed(seed: int, out: Path, arms: tuple[str, ...], extra: list[str], demo_runs: Path | None = None) -> dict[str, Any]:
    """Every arm of one seed; held-out accuracies and wall times.

    With ``demo_runs``, the grpo arm is not run again but read from ``demo_runs/seed_<seed>``, a
    finished ``m2flow demo seed=<seed>`` with the same overrides.
    """
    import time

    from m2flow.workflows.reasoning.demo import load_demo_config, run_demo

    result: dict[str, Any] = {"seed": seed}
    grpo_dir = demo_runs / f"seed_{seed}" if demo_runs else out / f"seed_{seed}" / "grpo"
    base = [f"seed={seed}", "metrics.sinks=[jsonl]", *extra]
    for arm in arms:
        run_dir = out / f"seed_{seed}" / arm
        overrides = [*base, f"run_dir={run_dir}"]
        if arm == "sft_more":
            cfg = load_demo_config(base)
            more = cfg.steps * cfg.data.prompts_per_step * cfg.rollout.sampling.n // cfg.model.warm_start.batch_size
            overrides += [f"model.warm_start.steps={cfg.model.warm_start.steps + more}", "steps=1", "eval_every=1"]
        elif arm == "random_reward":
            if not (grpo_dir / "warm_start").is_dir():
                raise RuntimeError("the random_reward arm reuses the grpo arm's warm start: run grpo first")
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            shutil.copytree(grpo_dir / "warm_start", run_dir / "warm_start")
            # The held-out evaluation keeps the exact-answer reward: only training sees the coin.
            overrides += [f"model.path={grpo_dir / 'base_model'}", f"reward.fn={REWARD_PATH}",
                          f"eval_reward={cfg_reward(base)}"]
        elif arm != "grpo":
            raise ValueError(f"unknown arm {arm!r}; valid: {list(ARMS)}")
        if arm == "grpo" and demo_runs is not None:
            curve = _accuracies(grpo_dir)
            result.update(warm_start_accuracy=curve[0][1], grpo_accuracy=curve[-1][1], grpo_curve=curve)
            continue
        start = time.perf_counter()
        outcome = run_demo(overrides)
        result[f"{arm}_seconds"] = round(time.perf_counter() - start, 1)
        result[f"{arm}_accuracy"] = outcome.warm_start_accuracy if arm == "sft_more" else outcome.final_accuracy
        if arm == "grpo":
            result["warm_start_accuracy"] = outcome.warm_start_accuracy
            result["grpo_curve"] = _accuracies(grpo_dir)
        log.info("seed %d %s: held-out accuracy %.3f", seed, arm, result[f"{arm}_accuracy"])
    return result


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table of held-out accuracy per seed and arm, with the mean."""
    cols = ["warm_start", *(a for a in ("sft_more", "random_reward", "grpo") if f"{a}_accuracy" in results[0])]
    lines = ["| seed | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for r in results:
        lines.append(f"| {r['seed']} | " + " | ".join(f"{r[f'{c}_accuracy']:.3f}" for c in cols) + " |")
    means = " | ".join(f"{statistics.mean(r[f'{c}_accuracy'] for r in results):.3f}" for c in cols)
    lines.append(f"| mean | {means} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="held-out accuracy of the demo: GRPO vs more supervised steps vs a random reward")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms from {list(ARMS)} (grpo first)")
    ap.add_argument("--out", default="runs/demo_study", help="one run directory per seed and arm, one JSON per seed")
    ap.add_argument("--demo-runs", metavar="DIR", help="read the grpo arm from finished demo runs DIR/seed_<seed>")
    ap.add_argument("--table", metavar="DIR", help="only print the table of the JSON files in DIR")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="demo config overrides for every arm")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.table:
        print(table([json.loads(p.read_text()) for p in sorted(Path(args.table).glob("seed_*.json"))]))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        result = run_seed(seed, out, tuple(args.arms.split(",")), list(args.overrides),
                          Path(args.demo_runs) if args.demo_runs else None)
        path = out / f"seed_{seed}.json"
        if path.is_file():  # arms run earlier (another --arms) stay; those run now replace theirs
            result = {**json.loads(path.read_text()), **result}
        path.write_text(json.dumps(result, indent=1))
        results.append(result)
    print(table(results))


if __name__ == "__main__":
    main()
