"""E1's PPO update, eager against compiled minibatch steps (`actor.compile`), in one process.

Two updaters start from the same (64, 64) MLP actor-critic of HalfCheetah-v5's shapes (17
observations, 6 actions) and train on the same random 2,048-sample batch: 10 epochs of minibatch
64, as E1. Their `PPOUpdater.update` calls alternate; the compile (in `warm_up`, before the
timing) is reported apart.

    python benchmarks/ppo_update_step.py
    python benchmarks/ppo_update_step.py --threads 2 --rounds 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from m2flow.models.policies import PolicyConfig, build_policy
from m2flow.workers.embodied.actor import zero_batch
from m2flow.workers.embodied.config import PPOConfig
from m2flow.workers.embodied.ppo import PPOBatch, PPOUpdater

OBS = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)


def _batch(size: int) -> PPOBatch:
    g = torch.Generator().manual_seed(1)
    values, advantages = torch.randn(size, generator=g), torch.randn(size, generator=g)
    return PPOBatch(torch.randn(size, 17, generator=g), torch.randn(size, 6, generator=g) * 0.5,
                    -torch.rand(size, generator=g) * 2 - 5, values, advantages, advantages + values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6, help="update pairs timed (after one untimed pair)")
    p.add_argument("--batch", type=int, default=2048)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    updaters = {}
    for compile in (False, True):
        torch.manual_seed(0)
        updaters[compile] = PPOUpdater(build_policy(OBS, ACT, PolicyConfig(hidden_sizes=[64, 64])), PPOConfig(),
                                       compile=compile)
    t0 = time.perf_counter()
    updaters[True].warm_up(zero_batch(OBS, ACT, args.batch, torch.device("cpu")))
    compile_s = time.perf_counter() - t0
    batch = _batch(args.batch)
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds + 1):
        for compile, updater in updaters.items():
            t0 = time.perf_counter()
            updater.update(batch)
            if r:
                times[compile].append(time.perf_counter() - t0)
    eager, compiled = (statistics.median(times[c]) for c in (False, True))
    diff = float((updaters[False].flat.param - updaters[True].flat.param).abs().max().detach())
    print(f"threads {args.threads}, batch {args.batch}: eager {eager:.4f} s, compiled {compiled:.4f} s per update "
          f"({eager / compiled:.2f}x; per round {[round(a / b, 2) for a, b in zip(times[False], times[True])]}); "
          f"compile {compile_s:.1f} s; compiled {updaters[True].compiling}; "
          f"max weight difference after {args.rounds + 1} updates {diff:.1e}")


if __name__ == "__main__":
    main()
