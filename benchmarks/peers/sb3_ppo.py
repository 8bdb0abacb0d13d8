"""Stable-Baselines3 PPO on a gymnasium env: the E1 reference peer. Prints one JSON line.

Runs in its own virtual environment (``benchmarks/e1_embodied.py --setup`` creates
``benchmarks/.venvs/sb3``). Settings: 8 ``DummyVecEnv`` envs under ``VecNormalize`` (obs and
reward), ``n_steps=256`` (2048 per update), minibatch 64, 10 epochs, gamma 0.99, GAE lambda 0.95,
clip 0.2, lr 3e-4, entropy 0, value coef 0.5, max grad norm 0.5, default ``MlpPolicy`` on CPU.
Returns are the raw episode returns recorded by SB3's ``Monitor`` wrapper.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="HalfCheetah-v5", help="gymnasium id")
    p.add_argument("--steps", type=int, default=20_000, help="total env steps (rounded up to updates)")
    p.add_argument("--seed", type=int, default=0, help="seed of SB3, the envs and torch")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--last-n", type=int, default=20, help="returns averaged over the last N episodes")
    p.add_argument("--checkpoints", default="100000,300000", help="env steps at which returns are noted")
    p.add_argument("--num-envs", type=int, default=8, help="parallel envs")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    # Thread pools are sized when torch loads; set them first.
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(args.threads))
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(args.threads)
    try:  # MuJoCo 4 warns about the stock models on every load; keep stderr and the cwd clean.
        import mujoco

        mujoco.set_mju_user_warning(lambda msg: None)
    except ImportError:
        pass

    checkpoints = sorted(int(c) for c in args.checkpoints.split(",") if c)
    noted: dict[str, float | None] = {}

    def recent_mean(model: PPO) -> float | None:
        returns = [info["r"] for info in model.ep_info_buffer][-args.last_n :]
        return float(np.mean(returns)) if returns else None

    class Checkpoints(BaseCallback):
        """Notes the recent mean return when the step count first passes each checkpoint."""

        def __init__(self) -> None:
            super().__init__()
            self.episodes = 0

        def _on_step(self) -> bool:
            self.episodes += int(np.sum(self.locals["dones"]))
            return True

        def _on_rollout_end(self) -> None:
            for c in checkpoints:
                if self.num_timesteps >= c and str(c) not in noted:
                    noted[str(c)] = recent_mean(self.model)

    venv = make_vec_env(args.env, n_envs=args.num_envs, seed=args.seed, vec_env_cls=DummyVecEnv)
    venv = VecNormalize(venv, norm_obs=True, norm_reward=True, gamma=0.99)
    model = PPO(
        "MlpPolicy",
        venv,
        n_steps=256,
        batch_size=64,
        n_epochs=10,
        learning_rate=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    update_time = 0.0
    train = model.train

    def timed_train() -> None:
        nonlocal update_time
        t0 = time.perf_counter()
        train()
        update_time += time.perf_counter() - t0

    model.train = timed_train
    callback = Checkpoints()
    start = time.perf_counter()
    model.learn(total_timesteps=args.steps, callback=callback)
    wall = time.perf_counter() - start
    steps = model.num_timesteps
    venv.close()
    print(json.dumps({
        "side": "sb3",
        "env": args.env,
        "seed": args.seed,
        "threads": args.threads,
        "steps": steps,
        "wall_s": round(wall, 3),
        "env_steps_per_s": round(steps / wall, 1),
        "update_frac": round(update_time / wall, 3),
        "mean_return": recent_mean(model),
        "last_n": args.last_n,
        "episodes": callback.episodes,
        "checkpoints": noted,
    }))


if __name__ == "__main__":
    main()
