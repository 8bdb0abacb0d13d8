"""Stable-Baselines3 PPO with its ``CnnPolicy`` on MetaWorld pixels: the V1 throughput peer. Prints one JSON line.

Runs in its own virtual environment (``benchmarks/v1_throughput.py --setup`` creates
``benchmarks/.venvs/sb3-v1``), with the repository on ``PYTHONPATH`` so that it steps the very env
class m2flow steps: ``m2flow.envs.metaworld.MetaWorldPixelEnv`` (64x64 RGB from the "corner"
camera, rotated upright, fast render settings; dense reward = MetaWorld's shaped reward / 10;
100-step episodes that do not end at success). That import needs numpy, torch, gymnasium, PyYAML,
OmegaConf, MetaWorld and MuJoCo only, all in the peer's venv. ``CnnPolicy`` takes images alone: a wrapper
hands it the (64, 64, 3) uint8 image out of the packed observation (no instruction, no proprio).

Settings (m2flow's V1 example): 8 envs, ``n_steps=64`` (512 per update), minibatch 128, 2 epochs,
lr 1e-4, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0, value coef 0.5, max grad norm 0.5,
no ``target_kl``, rewards normalised by ``VecNormalize`` (images not). ``--vec dummy`` steps the 8
envs in this process, ``--vec subproc`` in 8 processes (SB3's ``SubprocVecEnv`` runs one env per
process). Times reported: the ``learn()`` call (the loop), its ``train()`` calls (the update), and
the time spent in the vector env's ``step`` (rendering and simulation, as seen from the learner).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="reach-v3", help="MetaWorld v3 task")
    p.add_argument("--steps", type=int, default=8192, help="total env steps (whole updates of 512)")
    p.add_argument("--seed", type=int, default=0, help="seed of SB3, torch and the envs (env i: seed + i)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--vec", choices=["dummy", "subproc"], default="dummy", help="SB3 vector env class")
    p.add_argument("--num-envs", type=int, default=8, help="parallel envs")
    return p.parse_args()


def make_env(task: str):
    """One image-only MetaWorld env for ``CnnPolicy`` (built inside a subprocess for ``--vec subproc``)."""
    import gymnasium as gym
    import numpy as np

    from m2flow.envs.metaworld import MetaWorldPixelEnv

    class ImageOnly(gym.ObservationWrapper):
        """The (H, W, 3) uint8 image of a packed pixel-and-language observation."""

        def __init__(self, env: MetaWorldPixelEnv) -> None:
            super().__init__(env)
            lay = env.layout
            self.observation_space = gym.spaces.Box(0, 255, (lay.height, lay.width, lay.channels), dtype=np.uint8)

        def observation(self, obs: np.ndarray) -> np.ndarray:
            return self.env.unwrapped.layout.unpack(obs)[0]

    env = MetaWorldPixelEnv(task, height=64, width=64, camera="corner", proprio=True, max_episode_steps=100,
                            reward="dense", terminate_on_success=False)
    return ImageOnly(env)


def main() -> None:
    args = parse_args()
    # Thread pools are sized when torch loads; set them first. EGL before MuJoCo loads its GL.
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(args.threads))
    os.environ.setdefault("MUJOCO_GL", "egl")
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnvWrapper, VecNormalize

    torch.set_num_threads(args.threads)

    class StepTimer(VecEnvWrapper):
        """Seconds spent in the wrapped vector env's step (async + wait), as the learner waits for it."""

        def __init__(self, venv) -> None:
            super().__init__(venv)
            self.seconds = 0.0

        def reset(self):
            return self.venv.reset()

        def step_async(self, actions: np.ndarray) -> None:
            t0 = time.perf_counter()
            self.venv.step_async(actions)
            self.seconds += time.perf_counter() - t0

        def step_wait(self):
            t0 = time.perf_counter()
            out = self.venv.step_wait()
            self.seconds += time.perf_counter() - t0
            return out

    vec_cls = DummyVecEnv if args.vec == "dummy" else SubprocVecEnv
    venv = make_vec_env(make_env, n_envs=args.num_envs, seed=args.seed, vec_env_cls=vec_cls,
                        env_kwargs={"task": args.task})
    timer = StepTimer(venv)
    # m2flow's example normalises rewards (not the byte observations): the same here.
    model = PPO(
        "CnnPolicy",
        VecNormalize(timer, norm_obs=False, norm_reward=True, gamma=0.99),
        n_steps=64,
        batch_size=128,
        n_epochs=2,
        learning_rate=1e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        target_kl=None,
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    update_s = 0.0
    train = model.train

    def timed_train() -> None:
        nonlocal update_s
        t0 = time.perf_counter()
        train()
        update_s += time.perf_counter() - t0

    model.train = timed_train
    params = sum(p.numel() for p in model.policy.parameters())
    start = time.perf_counter()
    model.learn(total_timesteps=args.steps)
    loop = time.perf_counter() - start
    steps = model.num_timesteps
    returns = [info["r"] for info in model.ep_info_buffer]
    model.env.close()
    print(json.dumps({
        "side": f"sb3-{args.vec}-t{args.threads}",
        "vec": args.vec,
        "threads": args.threads,
        "task": args.task,
        "seed": args.seed,
        "steps": steps,
        "params": params,
        "observes": "image (64, 64, 3) uint8",
        "loop_s": round(loop, 3),
        "startup_in_process_s": round(start - T0, 3),
        "env_s": round(timer.seconds, 3),
        "update_s": round(update_s, 3),
        # what is left of the loop: the policy's forward on every step, buffers, GAE
        "policy_other_s": round(loop - timer.seconds - update_s, 3),
        "loop_env_steps_per_s": round(steps / loop, 2),
        "episodes": len(returns),
        "mean_return": float(np.mean(returns)) if returns else None,
    }))


T0 = time.perf_counter()

if __name__ == "__main__":
    main()
