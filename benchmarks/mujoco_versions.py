"""Locomotion env rate under two MuJoCo installs, side by side: is the version MetaWorld pins slower?

    python benchmarks/mujoco_versions.py --python A=/path/to/venv-a/bin/python --python B=/path/to/venv-b/bin/python

Each round runs, in each interpreter in turn (A B A B ...), one HalfCheetah-v5 and one Hopper-v5
env for ``--seconds`` with seeded random actions, resets included, and checks that two rollouts of
the same seed are identical. Writes ``benchmarks/results/mujoco_versions.json``: per side its
MuJoCo version and median steps/s, and B / A per env.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import environment, median, write_result  # noqa: E402

PROBE = r"""
import json, sys, time
import gymnasium as gym, mujoco, numpy as np
out = {"mujoco": mujoco.__version__}
for env_id in ("HalfCheetah-v5", "Hopper-v5"):
    env = gym.make(env_id, disable_env_checker=True)
    runs = []
    for _ in range(2):
        env.reset(seed=1); env.action_space.seed(1)
        runs.append(np.stack([env.step(env.action_space.sample())[0] for _ in range(100)]))
    env.reset(seed=0); env.action_space.seed(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < float(sys.argv[1]):
        _, _, term, trunc, _ = env.step(env.action_space.sample()); n += 1
        if term or trunc:
            env.reset()
    out[env_id] = {"steps_per_s": n / (time.perf_counter() - t0), "deterministic": bool(np.array_equal(*runs))}
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", required=True, help="NAME=interpreter, twice")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    sides = dict(item.split("=", 1) for item in args.python)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, python in sides.items():
            done = subprocess.run([python, "-c", PROBE, str(args.seconds)], capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    result = {"command": " ".join(["python", *sys.argv]), "environment": environment(), "sides": {}}
    for name, rows in runs.items():
        result["sides"][name] = {"mujoco": rows[0]["mujoco"], **{
            env_id: {"steps_per_s": median([r[env_id]["steps_per_s"] for r in rows]),
                     "deterministic": all(r[env_id]["deterministic"] for r in rows)}
            for env_id in ("HalfCheetah-v5", "Hopper-v5")}}
    a, b = list(sides)
    result["ratio_b_over_a"] = {env_id: result["sides"][b][env_id]["steps_per_s"] / result["sides"][a][env_id]["steps_per_s"]
                                for env_id in ("HalfCheetah-v5", "Hopper-v5")}
    write_result("mujoco_versions", result)
    print(json.dumps(result["sides"]), "B/A:", result["ratio_b_over_a"])


if __name__ == "__main__":
    main()
