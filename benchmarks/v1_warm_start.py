"""V1 warm start: scripted-expert demonstrations on MetaWorld, behaviour cloning of the small VLA, success on held-out seeds.

    python benchmarks/v1_warm_start.py --tasks mt3 --episodes 100 --epochs 20 --eval-seeds 20 --threads 2

Writes ``benchmarks/results/v1_warm_start.json``: the demo count and collection time, the BC loss
per epoch, the success rate per task on held-out seeds (and the experts' own rate on those seeds),
the wall time of each phase, and the command. Needs the ``metaworld`` extra and EGL or OSMesa.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import RESULTS, environment, write_result  # noqa: E402
from m2flow.envs.metaworld import expand_tasks, held_out_seeds  # noqa: E402
from m2flow.envs.metaworld_demos import Demos, collect_demos, evaluate_success, expert_success  # noqa: E402
from m2flow.models.bc import BCConfig, BCProgress, behaviour_clone  # noqa: E402
from m2flow.models.vla import VLAConfig, VLAPolicy, save_policy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="mt3", help="task family or comma-separated tasks")
    parser.add_argument("--episodes", type=int, default=100, help="expert episodes per task")
    parser.add_argument("--action-noise", type=float, default=0.1, help="noise on the executed expert action")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-seeds", type=int, default=20, help="held-out seeds per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--demos", default=str(Path(__file__).resolve().parents[1] / "runs" / "v1_demos.npz"), help="demo file (made when missing)")
    parser.add_argument("--name", default="v1_warm_start")
    parser.add_argument("--save", default="", help="write the cloned policy here (the file `policy.init_from` reads)")
    parser.add_argument("--grid", type=int, default=VLAConfig().grid,
                        help="the VLA's image tokens per side (policy.vla.grid; 2: 4 image tokens)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tasks = expand_tasks(args.tasks)
    result: dict = {"command": " ".join(["python", *sys.argv]), "tasks": tasks, "environment": environment()}

    t0 = time.perf_counter()
    path = Path(args.demos)
    if path.exists():
        demos = Demos.load(path)
    else:
        demos = collect_demos(tasks, args.episodes, seed=args.seed, action_noise=args.action_noise,
                              progress=lambda d, n: d % 50 == 0 and logging.info("demos %d/%d", d, n))
        demos.save(path)
    result["demos"] = {"episodes": len(demos.tasks), "steps": len(demos), "seeds": [int(demos.seeds.min()), int(demos.seeds.max())],
                       "action_noise": args.action_noise, "seconds": time.perf_counter() - t0, "file_mb": path.stat().st_size / 1e6}
    logging.info("demos: %s", result["demos"])

    policy = VLAPolicy(VLAConfig(grid=args.grid), action_dim=demos.actions.shape[1])
    result["params"] = sum(p.numel() for p in policy.parameters())
    t0 = time.perf_counter()
    history = behaviour_clone(policy, demos.obs, demos.actions,
                              BCConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed),
                              progress=lambda p: logging.info("%s", p), episode=demos.episode)
    result["bc"] = {"seconds": time.perf_counter() - t0, "epochs": [vars(h) for h in history]}
    del demos
    if args.save:
        result["saved"] = str(save_policy(policy, args.save))

    seeds = held_out_seeds(args.eval_seeds)
    result["eval_seeds"] = [seeds[0], seeds[-1]]

    def act(obs: np.ndarray) -> np.ndarray:
        return policy.act(torch.from_numpy(obs), deterministic=True).actions.numpy()

    t0 = time.perf_counter()
    result["success_bc"] = evaluate_success(act, tasks, seeds)
    result["eval_seconds"] = time.perf_counter() - t0
    logging.info("BC success on held-out seeds: %s", result["success_bc"])
    result["success_expert"] = expert_success(tasks, seeds)
    logging.info("expert success on the same seeds: %s", result["success_expert"])
    path = write_result(args.name, result)
    print(f"v1 warm start: BC success {result['success_bc']} (experts {result['success_expert']}), "
          f"{result['demos']['episodes']} episodes, BC {result['bc']['seconds']:.0f} s -> {path}")


if __name__ == "__main__":
    main()
