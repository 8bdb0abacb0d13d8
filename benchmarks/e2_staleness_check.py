"""E2 side check: one plan, synchronous vs bounded staleness, on HalfCheetah-v5 for a few iterations.

Prints one line per run: the staleness, the loop's seconds, the mean iteration time of iterations
2-11 and of the last 10, the mean env stage, actor busy time, and the waits for a turn on a shared
device (actor and env), per iteration. Run the sides alternating, e.g.

    for s in 0 1 0 1; do python benchmarks/e2_staleness_check.py $s "env,rollout: 0-1, actor: 0"; done
"""

from __future__ import annotations

import argparse
import os
import tempfile


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("staleness", type=int, help="algorithm.max_staleness")
    p.add_argument("placement", help="the plan's placement")
    p.add_argument("--iterations", type=int, default=30, help="iterations of 2 x 4 envs x 256 steps")
    args = p.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from m2flow.config import from_dict
    from m2flow.runtime.logs import setup_logging
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED
    from m2flow.workflows.embodied.config import EmbodiedConfig

    setup_logging(console=False)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = from_dict(EmbodiedConfig, {
            "cluster": {"cpu_devices_per_node": 8}, "placement": args.placement,
            "env": {"env_id": "HalfCheetah-v5", "num_envs": 4}, "rollout_steps": 256,
            "total_env_steps": args.iterations * 2048, "algorithm": {"max_staleness": args.staleness},
            "run_dir": tmp, "metrics": {"sinks": []}})
        result = train(EMBODIED, cfg)
    h = result.history[1:]

    def mean(key: str) -> float:
        return round(sum(x.get(key, 0.0) for x in h) / len(h), 3)

    steps = [x["time/iteration_s"] for x in h]
    print(args.staleness, "loop", round(result.loop_s, 2), "first10", round(sum(steps[:10]) / 10, 3),
          "last10", round(sum(steps[-10:]) / 10, 3),
          "env", round(mean("time/env_busy_s") + mean("time/rollout_busy_s"), 3), "actor", mean("time/actor_busy_s"),
          "lockw", mean("time/actor_lock_wait_s"), "envlockw", mean("time/env_lock_wait_s"))


if __name__ == "__main__":
    main()
