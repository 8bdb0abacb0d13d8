"""V1 learning: success on held-out seeds of the warm start (``policy.warm_start`` or ``init_from``) and of an RL run's checkpoints.

    MUJOCO_GL=egl m2flow train examples/embodied/metaworld_vla_ppo.yaml          # the RL run
    python benchmarks/v1_rl.py --config examples/embodied/metaworld_vla_ppo.yaml --eval-seeds 50

Every policy is evaluated the same way as the warm start in ``v1_warm_start.py``: greedy action
tokens (``--decode sample``: sampled from the policy's token distributions, as in training, by one
generator seeded alike for every policy evaluated), MetaWorld's success flag, episodes of up to 200
steps that end at success, reset with held-out seeds (1,000,000 up, disjoint from every training
env's), the run's image size, camera and proprio. Writes ``benchmarks/results/<name>.json``:
success of the warm start and of each checkpoint (with its env steps), the run's wall time and env
steps from its metrics, the command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import environment, write_result  # noqa: E402
from m2flow.driver.registry import load_workflow_config  # noqa: E402
from m2flow.envs.metaworld import expand_tasks, held_out_seeds  # noqa: E402
from m2flow.envs.metaworld_demos import evaluate_success  # noqa: E402
from m2flow.models.init_weights import read_policy_state  # noqa: E402
from m2flow.models.vla import VLAPolicy  # noqa: E402

EVAL_KWARGS = ("height", "width", "camera", "proprio", "text_len")
"""The run's env settings the evaluation keeps; reward, termination and episode length are the warm start's."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/embodied/metaworld_vla_ppo.yaml")
    parser.add_argument("overrides", nargs="*", help="the run's config overrides (run_dir=..., seed=...)")
    parser.add_argument("--eval-seeds", type=int, default=50, help="held-out seeds per task")
    parser.add_argument("--steps", default="last", help="checkpoints to evaluate: 'last', 'all', 'none' or a list 20,40")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=10, help="episodes of a task run side by side")
    parser.add_argument("--name", default="v1_rl")
    parser.add_argument("--skip-warm-start", action="store_true", help="evaluate the checkpoints only")
    parser.add_argument("--decode", choices=("greedy", "sample"), default="greedy",
                        help="action tokens: the most likely ones, or sampled as the training episodes do")
    parser.add_argument("--sample-seed", type=int, default=0, help="the sampling generator's seed (--decode sample)")
    args = parser.parse_args()
    cfg, tasks = load_vla_run(args)
    env_kwargs = {k: v for k, v in cfg.env.env_kwargs.items() if k in EVAL_KWARGS}
    seeds = held_out_seeds(args.eval_seeds)
    run_dir = Path(cfg.run_dir)
    metrics = _metrics(run_dir)
    result: dict = {"command": " ".join(["python", *sys.argv]), "config": args.config, "overrides": args.overrides,
                    "tasks": tasks, "seed": cfg.seed, "decode": args.decode, "eval_seeds": [seeds[0], seeds[-1]],
                    "env_kwargs": env_kwargs,
                    "environment": environment(), "run": _run_summary(metrics)}
    policy = VLAPolicy(replace(cfg.policy.vla), action_dim=4)
    policy.eval()
    generator = torch.Generator()
    greedy = args.decode == "greedy"

    def act(obs: np.ndarray) -> np.ndarray:
        return policy.act(torch.from_numpy(obs), deterministic=greedy, generator=generator).actions.numpy()

    def success(weights: dict[str, torch.Tensor]) -> dict[str, float]:
        policy.load_state_dict(weights)
        generator.manual_seed(args.sample_seed)
        t0 = time.perf_counter()
        out = evaluate_success(act, tasks, seeds, env_kwargs, parallel=args.parallel)
        logging.info("success %s (%.0f s)", out, time.perf_counter() - t0)
        return out

    if not args.skip_warm_start:
        start = warm_start_file(cfg)
        result["warm_start"] = {"file": start, "success": success(read_policy_state(start))}
    steps_per_iteration = cfg.rollout_steps * cfg.env.num_envs
    result["checkpoints"] = []
    for step, path in _checkpoints(run_dir, args.steps):
        weights = torch.load(path / "actor.pt", map_location="cpu", weights_only=True)["policy"]
        result["checkpoints"].append({"iteration": step, "env_steps": step * steps_per_iteration,
                                      "success": success(weights)})
    out = write_result(args.name, result)
    last = result["checkpoints"][-1] if result["checkpoints"] else None
    print(f"v1 rl: warm start {result.get('warm_start', {}).get('success', 'not evaluated')} -> "
          f"{last['success'] if last else 'no checkpoint'} after {last['env_steps'] if last else 0} env steps "
          f"({args.eval_seeds} held-out seeds) -> {out}")


def load_vla_run(args: argparse.Namespace) -> tuple[object, list[str]]:
    """Logging and threads set, the run's config (``--config`` with its overrides) and its MetaWorld tasks."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    _, cfg = load_workflow_config(Path(args.config), args.overrides)
    if cfg.policy.kind != "vla" or cfg.env.backend != "metaworld":
        raise SystemExit("--config: needs policy.kind: vla on the metaworld backend")
    return cfg, expand_tasks(cfg.env.env_id, cfg.env.env_kwargs.get("instruction"))


def warm_start_file(cfg) -> str:
    """The policy RL started from: the run's behaviour-cloning warm start (``policy.warm_start``), else ``init_from``."""
    from m2flow.workflows.embodied.warm_start import POLICY_FILE, WARM_START_DIR

    if cfg.policy.warm_start.demos is not None:
        return str(Path(cfg.run_dir) / WARM_START_DIR / POLICY_FILE)
    if cfg.policy.init_from is None:
        raise SystemExit("the run has no warm start (policy.warm_start.demos) and no policy.init_from; --skip-warm-start")
    return cfg.policy.init_from


def _checkpoints(run_dir: Path, which: str) -> list[tuple[int, Path]]:
    found = sorted((int(p.name.split("_")[-1]), p) for p in (run_dir / "checkpoints").glob("step_*") if p.is_dir())
    if which == "last":
        return found[-1:]
    if which == "all":
        return found
    if which == "none":
        return []
    wanted = {int(s) for s in which.split(",")}
    return [(s, p) for s, p in found if s in wanted]


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_summary(rows: list[dict]) -> dict:
    """The RL run's env steps, wall time and its training success / return curve, from its metrics."""
    if not rows:
        return {}
    keys = ("env/total_steps", "env/episode_return_recent", "env/success_rate", "time/env_steps_per_s")
    curve = [{k: r[k] for k in ("step", *keys) if k in r} for r in rows]
    # from the first iteration's start (its end minus its length) to the last one's end: the loop, start-up excluded
    loop_s = rows[-1]["time"] - rows[0]["time"] + rows[0].get("time/iteration_s", 0.0)
    return {"iterations": len(rows), "env_steps": rows[-1].get("env/total_steps"), "loop_wall_s": loop_s,
            "curve": curve}


if __name__ == "__main__":
    main()
