"""E1 parity checks: m2flow's PPO pieces against Stable-Baselines3's on the very same data.

Three checks, each in one process, with the SB3 peer's packages (``benchmarks/.venvs/sb3``, made by
``python benchmarks/e1_embodied.py --setup``) appended to this interpreter's path:

- ``update``: SB3 collects one rollout (8 envs x 256 steps under ``VecNormalize``) and runs its
  ``PPO.train()``; m2flow's ``PPOUpdater`` then trains a policy holding SB3's initial weights on
  SB3's rollout buffer (its old log-probs, values, advantages, returns), drawing SB3's minibatch
  permutations. Printed: per parameter, |step_m2flow - step_sb3| / |step_sb3|, for the closed-form
  gradient and for autograd.
- ``env``: SB3's ``DummyVecEnv`` + ``VecNormalize`` and m2flow's ``VecEnv`` step on the same seeds
  and the same random actions; m2flow as one rank of 8 envs, and as two ranks of 4 whose statistics
  are merged every 256 steps (``NormSync``, E1's plan). Printed: the largest difference of the
  normalised observations and rewards, over the run and over its last 256 steps.

- ``loop``: the whole loop, iteration after iteration. SB3 collects a rollout and trains; m2flow's
  env workers (one rank of 8 envs, or ``--ranks 2`` of 4 merged after every iteration, each a real
  ``EnvWorker`` run outside the runtime) step with SB3's sampled actions, ``build_batch`` turns
  their trajectories into a batch with the policy m2flow has trained so far (SB3's initial weights
  at the start), and ``PPOUpdater`` trains on it in SB3's minibatch order. SB3's 1e-4-sample prior
  of its statistics is removed so both sides start from no samples. Printed per iteration: the
  largest difference of the observations, the rewards (SB3's hold gamma * V(last observation) at
  time-limit truncations), values, log-probs, advantages and returns relative to SB3's largest, and
  of the weights after the update relative to SB3's step.

    python benchmarks/e1_sb3_parity.py update --env HalfCheetah-v5
    python benchmarks/e1_sb3_parity.py env --env HalfCheetah-v5 --steps 3000
    python benchmarks/e1_sb3_parity.py loop --env HalfCheetah-v5 --iterations 8 --ranks 1
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# SB3 modules by name: (m2flow, SB3) for each linear layer of the default MlpPolicy.
LAYERS = {
    "actor_trunk.net.1": "mlp_extractor.policy_net.0",
    "actor_trunk.net.3": "mlp_extractor.policy_net.2",
    "critic_trunk.net.1": "mlp_extractor.value_net.0",
    "critic_trunk.net.3": "mlp_extractor.value_net.2",
    "head.mean": "action_net",
    "value_head": "value_net",
}
BATCH, ENVS, STEPS, EPOCHS = 2048, 8, 256, 10


def _sb3_path() -> None:
    found = sorted((HERE / ".venvs" / "sb3" / "lib").glob("python*/site-packages"))
    if not found:
        raise SystemExit("no benchmarks/.venvs/sb3; run python benchmarks/e1_embodied.py --setup first")
    sys.path.append(str(found[0]))
    sys.path.insert(0, str(ROOT))


def _sb3_venv(env_id: str):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    return VecNormalize(make_vec_env(env_id, n_envs=ENVS, seed=0, vec_env_cls=DummyVecEnv), gamma=0.99)


def check_update(env_id: str) -> None:
    from stable_baselines3 import PPO

    from m2flow.models.policies import build_policy
    from m2flow.workers.embodied.config import PPOConfig
    from m2flow.workers.embodied.ppo import PPOBatch, PPOUpdater

    venv = _sb3_venv(env_id)
    model = PPO("MlpPolicy", venv, n_steps=STEPS, batch_size=64, n_epochs=EPOCHS, learning_rate=3e-4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, seed=0, device="cpu")
    _, callback = model._setup_learn(2 * BATCH, None)
    callback.on_training_start(locals(), globals())
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=STEPS)
    before = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
    buf = model.rollout_buffer

    def flat(name: str) -> torch.Tensor:  # SB3's own flattening (swap_and_flatten): env-major
        a = np.asarray(getattr(buf, name))
        a = a.swapaxes(0, 1).reshape(a.shape[0] * a.shape[1], *a.shape[2:])
        t = torch.as_tensor(a, dtype=torch.float32)
        return t.reshape(BATCH) if name not in ("observations", "actions") else t

    batch = PPOBatch(flat("observations"), flat("actions"), flat("log_probs"), flat("values"), flat("advantages"),
                     flat("returns"))
    rng = np.random.get_state()
    model.train()  # draws one np.random.permutation per epoch and nothing else from numpy
    np.random.set_state(rng)
    perms = [torch.from_numpy(np.random.permutation(BATCH)) for _ in range(EPOCHS)]
    after = model.policy.state_dict()

    policy = build_policy(venv.observation_space, venv.action_space)
    start = {f"{m}.{p}": before[f"{s}.{p}"] for m, s in LAYERS.items() for p in ("weight", "bias")}
    start["head.log_std"] = before["log_std"]
    policy.load_state_dict(start)
    names = {**{f"{m}.{p}": f"{s}.{p}" for m, s in LAYERS.items() for p in ("weight", "bias")},
             "head.log_std": "log_std"}
    for closed_form in (True, False):
        mine = copy.deepcopy(policy)
        updater = PPOUpdater(mine, PPOConfig(), closed_form=closed_form)
        order = iter(perms)
        randperm = torch.randperm
        torch.randperm = lambda n, generator=None: next(order)  # SB3's minibatch order
        try:
            updater.update(batch)
        finally:
            torch.randperm = randperm
        got = mine.state_dict()
        rel = {}
        for m, s in names.items():
            sb3_step, m2_step = after[s] - before[s], got[m] - before[s]
            rel[m] = float((m2_step - sb3_step).norm() / sb3_step.norm()) if sb3_step.norm() > 0 else 0.0
        worst = max(rel, key=rel.get)
        print(f"update {env_id} ({'closed-form' if closed_form else 'autograd'} gradient): largest relative "
              f"difference of a parameter's step {rel[worst]:.1e} ({worst}); median {np.median(list(rel.values())):.1e}")


def check_env(env_id: str, steps: int) -> None:
    from m2flow.envs import EnvConfig, VecEnv
    from m2flow.workers.embodied.normsync import NormSync

    sb3 = _sb3_venv(env_id)
    one = VecEnv(EnvConfig(env_id=env_id, num_envs=ENVS))
    two = [VecEnv(EnvConfig(env_id=env_id, num_envs=ENVS // 2), rank=r) for r in range(2)]
    syncs = [NormSync(v) for v in two]
    sb3.reset(), one.reset(), [v.reset() for v in two]
    rng = np.random.default_rng(0)
    diffs: dict[str, list[tuple[float, float]]] = {"one rank of 8": [], "two ranks of 4": []}
    for t in range(steps):
        if t and t % STEPS == 0:  # the end of an iteration: merge as the runner does
            deltas = [s.delta() for s in syncs]
            for s in syncs:
                s.merge(deltas)
        actions = rng.normal(size=(ENVS, *sb3.action_space.shape)).astype(np.float32)
        obs, reward, dones, _ = sb3.step(np.clip(actions, sb3.action_space.low, sb3.action_space.high))
        res1 = one.step(actions)
        res2 = [v.step(actions[i * ENVS // 2:(i + 1) * ENVS // 2]) for i, v in enumerate(two)]
        if not (dones == (res1.terminated | res1.truncated)).all():
            raise SystemExit(f"step {t}: the episodes end at different steps")
        scale = np.abs(reward).max() + 1e-9
        for name, o, r in (("one rank of 8", res1.obs, res1.reward),
                           ("two ranks of 4", np.concatenate([x.obs for x in res2]),
                            np.concatenate([x.reward for x in res2]))):
            diffs[name].append((float(np.abs(obs - o).max()), float(np.abs(reward - r).max() / scale)))
    for name, d in diffs.items():
        a = np.asarray(d)
        print(f"env {env_id}, {steps} steps, {name} vs SB3: normalised obs differ by up to {a[:, 0].max():.1e} "
              f"(last {STEPS} steps {a[-STEPS:, 0].max():.1e}), rewards by up to {a[:, 1].max():.1e} of the "
              f"step's largest (last {STEPS} steps {a[-STEPS:, 1].max():.1e})")


class _ReplayLink:
    """Hands an env worker the actions SB3 sampled, step by step, instead of running a policy."""

    policy_s = 0.0

    def __init__(self) -> None:
        self.actions: np.ndarray | None = None
        self.t = 0

    def send_obs(self, stage: int, obs: np.ndarray) -> None:
        pass

    def recv_actions(self, stage: int) -> np.ndarray:
        self.t += 1
        return self.actions[self.t - 1].copy()


def _local_env_worker(env_id: str, num_envs: int, rank: int, ranks: int):
    """A real ``EnvWorker`` outside the runtime: its rank context filled in, its policy link replayed."""
    from m2flow.envs import EnvConfig, make_env
    from m2flow.models.policies import PolicyConfig
    from m2flow.runtime.worker import WorkerContext
    from m2flow.workers.embodied.env import EnvWorker
    from m2flow.workers.embodied.settings import EmbodiedEnvSettings, EmbodiedRolloutSettings

    worker = EnvWorker.__new__(EnvWorker)
    worker._m2flow_ctx = WorkerContext(
        group_name="env", rank=rank, world_size=ranks, node_rank=0, node_id="local", node_ip="127.0.0.1",
        devices=(0,), device_type="cpu", local_rank=rank, local_world_size=ranks, namespace="parity",
        cluster_id="parity", num_threads=1)
    env = EnvConfig(env_id=env_id, num_envs=num_envs)
    probe = make_env(env)
    policy = EmbodiedRolloutSettings(probe.observation_space, probe.action_space, PolicyConfig(), 0, env_group="env",
                             env_ranks=ranks, stages=1, rollout_steps=STEPS)
    probe.close()
    worker.__init__(settings=EmbodiedEnvSettings(env, STEPS, actor_group="actor", actor_ranks=1), hosted={"rollout": policy})
    worker.link = _ReplayLink()
    return worker


def check_loop(env_id: str, iterations: int, ranks: int) -> None:
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger

    from m2flow.models.policies import build_policy
    from m2flow.workers.embodied.batch import build_batch
    from m2flow.workers.embodied.config import PPOConfig
    from m2flow.workers.embodied.messages import Trajectory
    from m2flow.workers.embodied.ppo import PPOUpdater

    venv = _sb3_venv(env_id)
    venv.obs_rms.count = venv.ret_rms.count = 1e-300  # no prior: both sides start from no samples
    model = PPO("MlpPolicy", venv, n_steps=STEPS, batch_size=64, n_epochs=EPOCHS, learning_rate=3e-4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, seed=0, device="cpu")
    model.set_logger(Logger(None, []))  # no log folder
    _, callback = model._setup_learn(iterations * BATCH, None)
    callback.on_training_start(locals(), globals())
    n = ENVS // ranks
    workers = [_local_env_worker(env_id, n, r, ranks) for r in range(ranks)]
    names = {**{f"{m}.{p}": f"{s}.{p}" for m, s in LAYERS.items() for p in ("weight", "bias")},
             "head.log_std": "log_std"}
    initial = model.policy.state_dict()
    policy = build_policy(venv.observation_space, venv.action_space)
    policy.load_state_dict({m: initial[s] for m, s in names.items()})
    cfg = PPOConfig()
    updater = PPOUpdater(policy, cfg)
    # SB3 flattens env-major (env * T + t), m2flow time-major (t * N + env)
    to_m2flow = torch.tensor([(i % STEPS) * ENVS + i // STEPS for i in range(BATCH)])

    def rel(a, b) -> float:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12))

    deltas = None
    print(f"loop {env_id}, m2flow with {ranks} env rank(s) of {n}: largest difference / SB3's largest")
    for it in range(iterations):
        before = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
        model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=STEPS)
        buf = model.rollout_buffer
        trajs = []
        for r, w in enumerate(workers):
            if deltas:
                w.norm.merge(deltas)
            w.link.actions, w.link.t = np.asarray(buf.actions[:, r * n:(r + 1) * n], np.float32), 0
            w._run(it)
            trajs.append(Trajectory(
                env_rank=r, iteration=it, obs=w.obs[:STEPS].copy(), actions=w.actions.copy(),
                rewards=w.rewards.copy(), terminated=w.terminated.copy(), truncated=w.truncated.copy(),
                final_index=w._final_index, final_obs=w._final_obs, last_obs=w.obs[STEPS].copy()))
            w.obs[0] = w.obs[STEPS]
        deltas = [w.norm.delta() for w in workers] if ranks > 1 else None
        batch, _ = build_batch(policy, trajs, cfg)
        rewards = np.concatenate([t.rewards for t in trajs], axis=1).astype(np.float64)
        for r, t in enumerate(trajs):  # SB3's rewards hold the bootstrap of truncated episodes
            if len(t.final_index):
                with torch.no_grad():
                    v = policy.value(torch.from_numpy(t.final_obs)).numpy()
                rewards[t.final_index[:, 0], t.final_index[:, 1] + r * n] += 0.99 * v
        truncations = int(sum(t.truncated.sum() for t in trajs))
        obs = np.concatenate([t.obs for t in trajs], axis=1)
        line = (f"  iteration {it}: obs {rel(obs, buf.observations):.1e}, rewards {rel(rewards, buf.rewards):.1e}, "
                f"values {rel(batch.values.view(STEPS, ENVS), buf.values):.1e}, "
                f"log-probs {rel(batch.logprobs.view(STEPS, ENVS), buf.log_probs):.1e}, "
                f"advantages {rel(batch.advantages.view(STEPS, ENVS), buf.advantages):.1e}, "
                f"returns {rel(batch.returns.view(STEPS, ENVS), buf.returns):.1e}")
        rng = np.random.get_state()
        model.train()  # draws one np.random.permutation per epoch and nothing else from numpy
        np.random.set_state(rng)
        perms = iter([to_m2flow[torch.from_numpy(np.random.permutation(BATCH))] for _ in range(EPOCHS)])
        randperm = torch.randperm
        torch.randperm = lambda size, generator=None: next(perms)  # SB3's minibatch order
        try:
            updater.update(batch)
        finally:
            torch.randperm = randperm
        after, got = model.policy.state_dict(), policy.state_dict()
        step = max(float((got[m] - after[s]).norm() / (after[s] - before[s]).norm()) for m, s in names.items())
        print(f"{line}; weights after the update {step:.1e} of SB3's step"
              + (f" ({truncations} time-limit truncations)" if truncations else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("check", choices=("update", "env", "loop"))
    p.add_argument("--env", default="HalfCheetah-v5", help="gymnasium id")
    p.add_argument("--steps", type=int, default=3000, help="env check: vector steps")
    p.add_argument("--iterations", type=int, default=8, help="loop check: iterations")
    p.add_argument("--ranks", type=int, default=1, choices=(1, 2), help="loop check: m2flow's env ranks")
    args = p.parse_args()
    torch.set_num_threads(1)
    _sb3_path()
    try:  # MuJoCo 4 warns about the stock models on every load
        import mujoco

        mujoco.set_mju_user_warning(lambda msg: None)
    except ImportError:
        pass
    if args.check == "update":
        check_update(args.env)
    elif args.check == "env":
        check_env(args.env, args.steps)
    else:
        check_loop(args.env, args.iterations, args.ranks)


if __name__ == "__main__":
    main()
