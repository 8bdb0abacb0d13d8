"""MetaWorld pixel env rate in one process: env-steps/s with random actions, fast vs default render settings.

    python benchmarks/v1_env_rate.py --tasks mt3 --steps 300 --size 64

Writes ``benchmarks/results/v1_env_rate.json`` with, per task, the steps/s of one env with the
fast render settings and with MetaWorld's defaults (multisampling, shadows, reflections, skybox),
their ratio measured side by side (A B A B, medians), and the simulation alone (no rendering).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks.common import environment, median, write_result  # noqa: E402
from m2flow.envs.metaworld import MetaWorldPixelEnv, expand_tasks  # noqa: E402


def rate(env: MetaWorldPixelEnv, steps: int, render: bool = True) -> float:
    """Steps/s of ``env`` under uniform random actions (resets included)."""
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    t0 = time.perf_counter()
    for _ in range(steps):
        a = rng.uniform(-1, 1, 4).astype(np.float32)
        if render:
            _, _, term, trunc, _ = env.step(a)
        else:  # the simulation alone, what rendering is added to
            env._mw.step(a)
            term, trunc = False, env._mw.curr_path_length >= env.max_episode_steps
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="mt3")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = {"command": " ".join(["python", *sys.argv]), "environment": environment(), "tasks": {}}
    for task in expand_tasks(args.tasks):
        fast = MetaWorldPixelEnv(task, height=args.size, width=args.size)
        slow = MetaWorldPixelEnv(task, height=args.size, width=args.size, fast_render=False)
        rounds = [(rate(fast, args.steps), rate(slow, max(args.steps // 10, 20)), rate(fast, args.steps, render=False))
                  for _ in range(args.rounds)]
        fast.close()
        slow.close()
        row = {"fast_steps_per_s": median([r[0] for r in rounds]), "default_steps_per_s": median([r[1] for r in rounds]),
               "sim_only_steps_per_s": median([r[2] for r in rounds]),
               "fast_over_default": median([r[0] / r[1] for r in rounds])}
        result["tasks"][task] = row
        print(f"{task}: {row['fast_steps_per_s']:.0f} steps/s fast, {row['default_steps_per_s']:.1f} default "
              f"({row['fast_over_default']:.1f}x), simulation alone {row['sim_only_steps_per_s']:.0f}")
    write_result("v1_env_rate", result)


if __name__ == "__main__":
    main()
