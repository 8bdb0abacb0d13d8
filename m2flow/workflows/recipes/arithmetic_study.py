"""Does the arithmetic demo learn from RL? Held-out accuracy after the warm start and after each arm.

For each seed the warm start runs once; three arms then start from copies of the same model:
- ``grpo``: the recipe's GRPO phase (exact-answer reward);
- ``sft_more``: the warm start simply continues on fresh demonstrations of the same teacher, as many
  as GRPO sampled responses (grpo_steps x prompts_per_step x group_size), at the warm-start batch
  size and learning rate: more supervised compute than GRPO spends on training;
- ``random_reward``: the same GRPO phase with a reward that ignores the response (1.0 with
  probability `random_reward_rate`), i.e. the same compute and updates with no information.

    python -m m2flow.workflows.recipes.arithmetic_study --seeds 0,1,2 --out runs/arithmetic_study
    python -m m2flow.workflows.recipes.arithmetic_study --table runs/arithmetic_study
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from m2flow.data.batch import Response
from m2flow.workflows.recipes.arithmetic_demo import (
    ArithmeticDemoRecipe,
    demonstrations,
    evaluate,
    heldout_problems,
    supervised,
    train_grpo,
    warm_start,
)

log = logging.getLogger(__name__)

ARMS = ("grpo", "sft_more", "random_reward")


def run_seed(recipe: ArithmeticDemoRecipe, arms: tuple[str, ...] = ARMS, random_reward_rate: float = 0.2) -> dict[str, Any]:
    """Warm start once, then each arm from a copy of the warm model; accuracies and wall times."""
    recipe.validate()
    if recipe.threads:
        torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    heldout = heldout_problems(recipe)
    warm = warm_start(recipe)
    out: dict[str, Any] = {
        "seed": recipe.seed,
        "warm_start_steps": warm.steps,
        "warm_start_seconds": round(warm.seconds, 1),
        "warm_start_accuracy": evaluate(warm.model, warm.tokenizer, heldout, recipe.max_new_tokens),
    }
    log.info("seed %d warm start: %s", recipe.seed, out)
    for arm in arms:
        model = copy.deepcopy(warm.model)
        start = time.perf_counter()
        if arm == "grpo":
            history = train_grpo(model, warm.tokenizer, recipe, heldout)
            out["grpo_curve"] = [(r["step"], r["heldout_accuracy"]) for r in history if "heldout_accuracy" in r]
        elif arm == "random_reward":
            rng = random.Random(recipe.seed)

            def coin(response: Response, answer: str) -> float:
                return float(rng.random() < random_reward_rate)

            train_grpo(model, warm.tokenizer, recipe, reward_fn=coin)
        elif arm == "sft_more":
            count = recipe.grpo_steps * recipe.prompts_per_step * recipe.group_size
            problems = demonstrations(recipe, count, seed=recipe.seed + 60_000)
            steps = max(1, count // recipe.sft_batch_size)
            supervised(model, warm.tokenizer, problems, recipe, steps, seed=recipe.seed + 1)
        else:
            raise ValueError(f"unknown arm {arm!r}; valid: {list(ARMS)}")
        out[f"{arm}_seconds"] = round(time.perf_counter() - start, 1)
        out[f"{arm}_accuracy"] = evaluate(model, warm.tokenizer, heldout, recipe.max_new_tokens)
        log.info("seed %d %s: held-out accuracy %.3f", recipe.seed, arm, out[f"{arm}_accuracy"])
    return out


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table of held-out accuracy per seed and arm, with the mean."""
    cols = ["warm_start"] + [a for a in ARMS if f"{a}_accuracy" in results[0]]
    lines = ["| seed | warm-start steps | " + " | ".join(cols) + " | GRPO s |", "|" + "---|" * (len(cols) + 3)]
    for r in results:
        accs = " | ".join(f"{r[f'{c}_accuracy']:.3f}" for c in cols)
        lines.append(f"| {r['seed']} | {r['warm_start_steps']} | {accs} | {r.get('grpo_seconds', float('nan'))} |")
    means = " | ".join(f"{statistics.mean(r[f'{c}_accuracy'] for r in results):.3f}" for c in cols)
    lines.append(f"| mean | | {means} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="held-out accuracy of the arithmetic demo: warm start vs GRPO vs controls")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms from {list(ARMS)}")
    ap.add_argument("--out", default="runs/arithmetic_study", help="directory of one JSON file per seed")
    ap.add_argument("--table", metavar="DIR", help="only print the table of the JSON files in DIR")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="recipe overrides, e.g. grpo_steps=50")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.table:
        results = [json.loads(p.read_text()) for p in sorted(Path(args.table).glob("seed_*.json"))]
        log.info("\n%s", table(results))
        return
    overrides = {}
    types = {f.name: f.type for f in dataclasses.fields(ArithmeticDemoRecipe)}
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"unknown recipe field {key!r}; valid: {sorted(types)}")
        overrides[key] = json.loads(value) if value[:1] in "[{0123456789-.tfn" else value
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        recipe = dataclasses.replace(ArithmeticDemoRecipe(), seed=seed, **overrides)
        result = run_seed(recipe, tuple(args.arms.split(",")))
        result["recipe"] = dataclasses.asdict(recipe)
        (out / f"seed_{seed}.json").write_text(json.dumps(result, indent=1))
        results.append(result)
    log.info("\n%s", table(results))


if __name__ == "__main__":
    main()
