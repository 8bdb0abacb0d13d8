"""A CleanRL-style single-file PPO for continuous control: the E1 peer that reads top to bottom.

Settings match Stable-Baselines3's PPO defaults so the two peers (and m2flow) learn the same thing:
8 envs x 256 steps = 2048 per update, 10 epochs of minibatch 64, gamma 0.99, GAE lambda 0.95,
clip 0.2, lr 3e-4 constant, entropy 0, value coef 0.5, max grad norm 0.5, Adam eps 1e-5,
per-minibatch advantage normalisation, no value clipping, separate (64, 64) tanh actor and critic,
state-independent log-std, orthogonal init, actions clipped to the bounds only when stepping.

Where it differs from CleanRL's ``ppo_continuous_action.py`` (to match SB3, not to improve it):
- observation / reward normalisation over the whole vector (as SB3's ``VecNormalize``), not per env;
- a time-limit truncation bootstraps: reward += gamma * V(final obs), as SB3 does;
- constant learning rate and unclipped value loss.

Needs only numpy, torch and gymnasium[mujoco]; knows nothing of m2flow. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import deque


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="HalfCheetah-v5", help="gymnasium id")
    p.add_argument("--steps", type=int, default=20_000, help="total env steps (rounded up to updates)")
    p.add_argument("--seed", type=int, default=0, help="seeds torch, numpy and the envs")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--last-n", type=int, default=20, help="returns averaged over the last N episodes")
    p.add_argument("--checkpoints", default="100000,300000", help="env steps at which returns are noted")
    p.add_argument("--num-envs", type=int, default=8, help="parallel envs")
    p.add_argument("--num-steps", type=int, default=256, help="steps per env per update")
    p.add_argument("--minibatch", type=int, default=64, help="samples per gradient step")
    p.add_argument("--epochs", type=int, default=10, help="passes over each batch")
    p.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate")
    p.add_argument("--gamma", type=float, default=0.99, help="discount")
    p.add_argument("--gae-lambda", type=float, default=0.95, help="GAE lambda")
    p.add_argument("--clip", type=float, default=0.2, help="PPO ratio clip")
    p.add_argument("--ent-coef", type=float, default=0.0, help="entropy bonus")
    p.add_argument("--vf-coef", type=float, default=0.5, help="value loss weight")
    p.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient norm clip")
    return p.parse_args()


args = parse_args()
# Thread pools are sized when torch loads; set them first.
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
os.environ.setdefault("MKL_NUM_THREADS", str(args.threads))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
np.random.seed(args.seed)
try:  # MuJoCo 4 warns about the stock models on every load; keep stderr and the cwd clean.
    import mujoco

    mujoco.set_mju_user_warning(lambda msg: None)
except ImportError:
    pass


# ---------------------------------------------------------------- running statistics (VecNormalize)
class RunningMeanStd:
    """Running mean/var, initialised like SB3's (a prior of 1e-4 samples with mean 0, var 1)."""

    def __init__(self, shape=()):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x):
        b_mean, b_var, b_count = x.mean(0), x.var(0), x.shape[0]
        delta, total = b_mean - self.mean, self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var, self.count = m2 / total, total


obs_rms_eps, clip_obs, clip_rew = 1e-8, 10.0, 10.0


def norm_obs(obs, rms):
    return np.clip((obs - rms.mean) / np.sqrt(rms.var + obs_rms_eps), -clip_obs, clip_obs).astype(np.float32)


# ------------------------------------------------------------------------------------- environments
envs = gym.vector.SyncVectorEnv(
    [lambda: gym.make(args.env, disable_env_checker=True) for _ in range(args.num_envs)],
    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,  # final obs in infos, next obs already reset
)
act_low, act_high = envs.single_action_space.low, envs.single_action_space.high
obs_dim = int(np.prod(envs.single_observation_space.shape))
act_dim = int(np.prod(envs.single_action_space.shape))
obs_rms, ret_rms = RunningMeanStd((obs_dim,)), RunningMeanStd(())
disc_returns = np.zeros(args.num_envs)


# ------------------------------------------------------------------------------------------- agent
def layer(i, o, gain=np.sqrt(2)):
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, gain)
    nn.init.zeros_(lin.bias)
    return lin


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, act_dim, 0.01))
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def value(self, x):
        return self.critic(x).squeeze(-1)

    def act_eval(self, x, action=None):
        mean = self.actor(x)
        dist = torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action).sum(-1), dist.entropy().sum(-1), self.value(x)


agent = Agent()
optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

# --------------------------------------------------------------------------------------- storage
T, N = args.num_steps, args.num_envs
buf_obs = torch.zeros(T, N, obs_dim)
buf_act = torch.zeros(T, N, act_dim)
buf_logp = torch.zeros(T, N)
buf_rew = torch.zeros(T, N)
buf_term = torch.zeros(T, N)  # 1 where the step ended the episode (terminated or truncated)
buf_val = torch.zeros(T, N)

# ------------------------------------------------------------------------------------------- loop
checkpoints = sorted(int(c) for c in args.checkpoints.split(",") if c)
noted: dict[str, float | None] = {}
ep_ret, ep_len = np.zeros(N), np.zeros(N, dtype=int)
finished: deque[float] = deque(maxlen=100)
episodes = 0
raw_obs, _ = envs.reset(seed=args.seed)
obs_rms.update(raw_obs)
next_obs = torch.as_tensor(norm_obs(raw_obs, obs_rms))
global_step, update_time = 0, 0.0
start = time.perf_counter()
while global_step < args.steps:
    # -- rollout: T steps of N envs
    for t in range(T):
        buf_obs[t] = next_obs
        with torch.no_grad():
            action, logp, _, value = agent.act_eval(next_obs)
        buf_act[t], buf_logp[t], buf_val[t] = action, logp, value
        raw_obs, reward, term, trunc, infos = envs.step(np.clip(action.numpy(), act_low, act_high))
        global_step += N
        done = term | trunc
        ep_ret += reward
        ep_len += 1
        for i in np.flatnonzero(done):
            finished.append(float(ep_ret[i]))
            episodes += 1
        ep_ret[done], ep_len[done] = 0.0, 0
        # reward scaling by the std of the discounted return (VecNormalize)
        disc_returns = disc_returns * args.gamma + reward
        ret_rms.update(disc_returns)
        scaled = np.clip(reward / np.sqrt(ret_rms.var + obs_rms_eps), -clip_rew, clip_rew)
        disc_returns[done] = 0.0
        obs_rms.update(raw_obs)
        next_obs = torch.as_tensor(norm_obs(raw_obs, obs_rms))
        # truncation: the episode would have continued, so bootstrap from its real last observation
        bootstrap = trunc & ~term
        if bootstrap.any():
            final = np.stack([infos["final_obs"][i] for i in np.flatnonzero(bootstrap)])
            with torch.no_grad():
                v_final = agent.value(torch.as_tensor(norm_obs(final, obs_rms))).numpy()
            scaled[bootstrap] += args.gamma * v_final
        buf_rew[t] = torch.as_tensor(scaled, dtype=torch.float32)
        buf_term[t] = torch.as_tensor(done, dtype=torch.float32)
    for c in checkpoints:
        if global_step >= c and str(c) not in noted:
            noted[str(c)] = float(np.mean(list(finished)[-args.last_n:])) if finished else None

    # -- GAE(lambda) advantages, backwards over the T steps
    with torch.no_grad():
        next_value = agent.value(next_obs)
    adv = torch.zeros(T, N)
    last = torch.zeros(N)
    for t in reversed(range(T)):
        v_next = next_value if t == T - 1 else buf_val[t + 1]
        nonterminal = 1.0 - buf_term[t]
        delta = buf_rew[t] + args.gamma * v_next * nonterminal - buf_val[t]
        last = delta + args.gamma * args.gae_lambda * nonterminal * last
        adv[t] = last
    returns = adv + buf_val

    # -- PPO update: epochs x shuffled minibatches
    t0 = time.perf_counter()
    b_obs, b_act, b_logp = buf_obs.reshape(T * N, -1), buf_act.reshape(T * N, -1), buf_logp.reshape(-1)
    b_adv, b_ret = adv.reshape(-1), returns.reshape(-1)
    for _ in range(args.epochs):
        perm = torch.randperm(T * N)
        for lo in range(0, T * N, args.minibatch):
            mb = perm[lo : lo + args.minibatch]
            _, new_logp, entropy, value = agent.act_eval(b_obs[mb], b_act[mb])
            ratio = (new_logp - b_logp[mb]).exp()
            mb_adv = b_adv[mb]
            mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - args.clip, 1 + args.clip)).mean()
            v_loss = ((value - b_ret[mb]) ** 2).mean()
            loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
    update_time += time.perf_counter() - t0

wall = time.perf_counter() - start
envs.close()
last = list(finished)[-args.last_n:]
print(json.dumps({
    "side": "cleanrl",
    "env": args.env,
    "seed": args.seed,
    "threads": args.threads,
    "steps": global_step,
    "wall_s": round(wall, 3),
    "env_steps_per_s": round(global_step / wall, 1),
    "update_frac": round(update_time / wall, 3),
    "mean_return": float(np.mean(last)) if last else None,
    "last_n": args.last_n,
    "episodes": episodes,
    "checkpoints": noted,
}))
