"""``EnvWorker``: one rank's vector of simulators, stepped in pipeline stages, producing trajectories.

Per iteration (``interact``) the rank's envs, split into K stages, take T steps each (T decisions
with action chunks: each executes up to ``chunk`` env steps, ``EnvGroup.step_chunk``)::

    send every stage's observations to the policy
    for t in 0 .. T-1:
        for each stage k:  receive k's actions -> step k's envs -> record -> send k's new observations

With a separate rollout rank, stage k simulates while the rollout infers stage k+1's actions: the
pipeline. K = 1 is the plain sequential loop. At the end the rank broadcasts its trajectory
segment to every actor rank and returns its statistics to the driver.

Observation and reward normalisation (``m2flow.envs.normalize``) is part of the pipeline, merged
across ranks after every iteration (``normsync``) and saved with the checkpoint, together with the
exact state of every env, so a resumed run continues the same episodes.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from m2flow.envs import EnvConfig, VecEnv
from m2flow.runtime.comm.transport import LinkKind
from m2flow.runtime.errors import RunHealthError
from m2flow.runtime.trace import get_tracer, trace_category
from m2flow.runtime.worker import Worker
from m2flow.workers.embodied.env_state import env_state_file, get_env_state, load_env_state, set_env_state
from m2flow.workers.state_file import save_state
from m2flow.workers.embodied.inference import PolicyEngine
from m2flow.workers.embodied.link import CommLink, InlineLink, StepLink
from m2flow.workers.embodied.messages import InteractStats, Trajectory
from m2flow.workers.embodied.normsync import NormSync
from m2flow.workers.embodied.settings import EmbodiedEnvSettings, EmbodiedRolloutSettings


class EnvWorker(Worker):
    """A vector of environments in K pipeline stages; with the rollout hosted it also runs the policy."""

    def __init__(self, *, settings: EmbodiedEnvSettings, hosted: Mapping[str, EmbodiedRolloutSettings] | None = None) -> None:
        s = settings
        for module in s.imports:  # registers custom env ids in this process
            importlib.import_module(module)
        env = s.env
        self.vec = VecEnv(env, rank=self.rank)
        self.T = s.rollout_steps
        self.chunk, self.chunk_discount = s.chunk, s.chunk_discount
        self.max_error_rate = s.max_error_rate
        self.reset_groups = s.reset_groups
        self.actor_group = s.actor_group
        self.actor_ranks = s.actor_ranks
        self.shares_devices = s.shares_devices
        self.offload_policy = s.offload
        self.stages = [self.vec.group_slice(k) for k in range(self.vec.num_groups)]
        n = self.vec.num_envs
        obs_space, act_space = self.vec.single_observation_space, self.vec.single_action_space
        # obs[t] is what the policy saw at step t; obs[T] the observation after the last step.
        self.obs = np.zeros((self.T + 1, n, *obs_space.shape), dtype=self._obs_dtype())
        chunk_shape = (self.chunk,) if self.chunk > 1 else ()
        self.actions = np.zeros((self.T, n, *chunk_shape, *act_space.shape), dtype=_action_dtype(act_space))
        # env steps each decision executed (action chunks only; otherwise one each)
        self.env_steps = np.zeros((self.T, n), dtype=np.int64) if self.chunk > 1 else None
        self.rewards = np.zeros((self.T, n), dtype=np.float32)
        # the log-probs of the actions under the weights that acted, where the policy hands them over
        self.logprobs = np.zeros((self.T, n), dtype=np.float32)
        self._scored = True
        self.terminated = np.zeros((self.T, n), dtype=bool)
        self.truncated = np.zeros((self.T, n), dtype=bool)
        self.obs[0] = self.vec.reset()
        self.norm = NormSync(self.vec)
        self.success_key = "is_success" if "is_success" in env.info_keys else None
        # The rollout hosted here (fused): its policy acts inside this process, a direct call per stage.
        self.host_components(hosted)
        self.engine: PolicyEngine | None = self.hosted("rollout")
        if self.engine is not None:
            self.link: StepLink = InlineLink(self.engine, self.rank)
        elif s.rollout_group is not None:
            self.link = CommLink(self, s.rollout_group, self.rank % s.rollout_ranks)
        else:
            raise ValueError("an env worker needs a rollout group to talk to, or the rollout hosted")

    def _obs_dtype(self) -> np.dtype:
        """float32 for vector observations (normalised or not); pixels keep their own dtype."""
        space = self.vec.single_observation_space
        if self.vec.obs_normalizer is not None or np.issubdtype(space.dtype, np.floating):
            return np.dtype(np.float32)
        return np.dtype(space.dtype)

    # -- introspection -------------------------------------------------------------------------
    def spaces(self) -> tuple[Any, Any]:
        """The single-env observation and action spaces (to build policies elsewhere)."""
        return self.vec.single_observation_space, self.vec.single_action_space

    def num_envs(self) -> int:
        return self.vec.num_envs

    # -- the iteration -------------------------------------------------------------------------
    @trace_category("env_step")
    def interact(self, iteration: int, norm_deltas: list | None = None, policy_version: int = 0) -> InteractStats:
        """T steps of every stage; the trajectory goes to every actor rank, the statistics back here.

        ``policy_version`` is the version of the weights the policy holds (stamped on the trajectory)."""
        if norm_deltas:
            self.norm.merge(norm_deltas)
        if self.reset_groups:  # GRPO: each iteration's episodes start from resets shared within groups
            self.obs[0] = self.vec.reset(group_seeds(self.vec.config.seed, iteration, self.rank, self.vec.num_envs,
                                                     self.reset_groups))
        t0 = time.perf_counter()
        if self.engine is not None and self.shares_devices:
            with self.device_turn(offload_after=self.offload_policy):
                lock_wait = time.perf_counter() - t0
                stats = self._run(iteration)
        else:
            lock_wait = 0.0
            stats = self._run(iteration)
        stats.lock_wait_s = lock_wait
        stats.norm_delta = self.norm.delta()
        traj = Trajectory(
            env_rank=self.rank, iteration=iteration, obs=self.obs[: self.T], actions=self.actions,
            rewards=self.rewards, terminated=self.terminated, truncated=self.truncated,
            final_index=self._final_index, final_obs=self._final_obs, last_obs=self.obs[self.T],
            policy_version=policy_version, env_steps=self.env_steps,
            behaviour_logprobs=self.logprobs if self._scored else None,
        )
        self.comm.broadcast(traj, self.actor_group, list(range(self.actor_ranks)))
        # Sent: the next iteration may overwrite the buffers, since receivers in other processes got
        # their own copies; one in this process holds these very arrays, so new ones are taken.
        last = self.obs[self.T]
        if self._actors_in_process():
            self.obs, self.actions, self.rewards, self.logprobs, self.terminated, self.truncated = (
                np.empty_like(a) for a in (self.obs, self.actions, self.rewards, self.logprobs, self.terminated,
                                           self.truncated))
            if self.env_steps is not None:
                self.env_steps = np.empty_like(self.env_steps)
        self.obs[0] = last
        return stats

    def _actors_in_process(self) -> bool:
        shared = getattr(self, "_actors_share_process", None)
        if shared is None:
            shared = self._actors_share_process = any(
                self.comm.transport_to(self.actor_group, r) == LinkKind.IN_PROCESS for r in range(self.actor_ranks))
        return shared

    def _run(self, iteration: int) -> InteractStats:
        vec, link, obs, T = self.vec, self.link, self.obs, self.T
        tracer = get_tracer()
        traced = tracer.enabled
        stats = InteractStats(env_rank=self.rank, steps=T * vec.num_envs)
        chunked = self.env_steps is not None
        executed = 0  # env steps the decisions executed (action chunks)
        finals_t: list[int] = []
        finals_env: list[np.ndarray] = []
        finals_obs: list[np.ndarray] = []
        busy = wait = 0.0
        scored = True  # every decision's log-probs came with its actions
        policy_before = link.policy_s
        start = time.perf_counter()
        for k, sl in enumerate(self.stages):
            link.send_obs(k, obs[0, sl])
        for t in range(T):
            for k, sl in enumerate(self.stages):
                t0 = time.perf_counter_ns()
                actions, logprobs = link.recv_actions(k)
                t1 = time.perf_counter_ns()
                self.actions[t, sl] = actions
                if logprobs is None:
                    scored = False
                else:
                    self.logprobs[t, sl] = logprobs
                if chunked:
                    res = vec.step_group_chunk(k, actions, self.chunk_discount)
                    self.env_steps[t, sl] = res.env_steps
                    executed += int(res.env_steps.sum())
                else:
                    res = vec.step_group(k, actions)
                self.rewards[t, sl] = res.reward
                self.terminated[t, sl] = res.terminated
                self.truncated[t, sl] = res.truncated
                obs[t + 1, sl] = res.obs
                if res.episode_env.size:
                    stats.episode_returns.extend(res.episode_return.tolist())
                    stats.episode_lengths.extend(res.episode_length.tolist())
                    if self.success_key is not None:
                        local = res.episode_env - sl.start
                        stats.successes.extend(res.infos[self.success_key][local].tolist())
                    cut = np.flatnonzero(res.bootstrap)
                    if cut.size:
                        finals_t.extend([t] * cut.size)
                        finals_env.append(cut + sl.start)
                        finals_obs.append(res.next_obs[cut])
                t2 = time.perf_counter_ns()
                if t + 1 < T:
                    link.send_obs(k, res.obs)
                wait += t1 - t0
                busy += t2 - t1
                if traced:
                    tracer.complete("wait_actions", t0, t1 - t0, cat="wait_channel", stage=k)
                    tracer.complete("env_step", t1, t2 - t1, cat="env_step", stage=k)
        self._final_index = np.stack(
            [np.asarray(finals_t, dtype=np.int64),
             np.concatenate(finals_env) if finals_env else np.zeros(0, dtype=np.int64)], axis=1)
        shape = self.obs.shape[2:]
        self._final_obs = np.concatenate(finals_obs) if finals_obs else np.zeros((0, *shape), self.obs.dtype)
        if chunked:  # metrics count env steps, not decisions, so rates compare across chunk sizes
            stats.steps = executed
        self._scored = scored
        stats.errors, last_error = vec.pop_errors()
        if stats.errors > self.max_error_rate * stats.steps:
            raise RunHealthError(
                f"env {vec.config.env_id}: {stats.errors} exceptions in {stats.steps} env steps on env rank {self.rank} "
                f"in iteration {iteration}, more than env_worker.max_error_rate={self.max_error_rate:g}; "
                f"the last: {last_error}")
        stats.wall_s = time.perf_counter() - start
        stats.policy_s = link.policy_s - policy_before
        stats.wait_s = wait * 1e-9
        # In a fused plan the policy runs inside send_obs, which the busy time must not count twice.
        stats.busy_s = busy * 1e-9
        return stats

    # -- weights (fused plans: the policy copy lives here) --------------------------------------
    @trace_category("weight_sync")
    def receive_weights(self, src_group: str, src_rank: int) -> float:
        """Receive the actor's weights into the fused policy copy; returns the seconds it took."""
        from m2flow.runtime.comm.weights import recv_weights

        if self.engine is None:
            raise RuntimeError("this env worker runs no policy; weights go to the rollout workers")
        t0 = time.perf_counter()
        recv_weights(self.comm, src_group, src_rank, into=self.engine.weights)
        self.engine.weights_changed()
        return time.perf_counter() - t0

    def offload(self) -> None:
        if self.engine is not None:
            self.engine.to("cpu")

    def onload(self) -> None:
        if self.engine is not None:
            self.engine.to(self.torch_device)

    # -- evaluation support ----------------------------------------------------------------------
    def normalizer_state(self) -> dict[str, Any]:
        """The normalisation statistics (to evaluate a policy elsewhere with them frozen)."""
        return self.vec.state_dict()

    # -- checkpoint ------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> str:
        """Write this rank's state (statistics, envs, current observations, RNG) under ``directory``."""
        state = {
            "vec": self.vec.state_dict(),
            "norm_sync": self.norm.state_dict(),
            "envs": [get_env_state(env) for group in self.vec.groups for env in group.envs],
            # Running episode returns and lengths are the groups' own bookkeeping.
            "episodes": [g.running_episodes() for g in self.vec.groups],
            "obs": self.obs[0].copy(),
            "engine_rng": self.engine.rng_state() if self.engine is not None else None,
        }
        path = Path(directory) / env_state_file(self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_state(state, path)
        return str(path)

    def load_checkpoint(self, directory: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote for this rank."""
        state = load_env_state(directory, self.rank)
        self.vec.load_state_dict(state["vec"])
        self.norm.load_state_dict(state["norm_sync"])
        envs = [env for group in self.vec.groups for env in group.envs]
        if len(envs) != len(state["envs"]):
            raise ValueError(f"the checkpoint has {len(state['envs'])} envs on rank {self.rank}, "
                             f"this run has {len(envs)}")
        for env, env_state in zip(envs, state["envs"]):
            set_env_state(env, env_state)
        for group, (ret, length) in zip(self.vec.groups, state["episodes"]):
            group.set_running_episodes(ret, length)
        self.obs[0] = state["obs"]
        if self.engine is not None and state["engine_rng"] is not None:
            self.engine.load_rng_state(state["engine_rng"])


def group_seeds(seed: int, iteration: int, rank: int, num_envs: int, group_size: int) -> list[int]:
    """The reset seed of each env of ``rank`` in ``iteration``: the envs in consecutive groups of
    ``group_size`` (over all ranks) share one, distinct per (run seed, iteration, group)."""
    first = rank * num_envs
    return [int(np.random.SeedSequence([seed, iteration, (first + i) // group_size]).generate_state(1)[0] & 0x7FFFFFFF)
            for i in range(num_envs)]


def _action_dtype(space: Any) -> np.dtype:
    import gymnasium as gym

    return np.dtype(np.int64) if isinstance(space, gym.spaces.Discrete) else np.dtype(space.dtype)


def env_config_for(env: EnvConfig, pipeline_stages: int) -> EnvConfig:
    """The env config of one rank: ``pipeline_stages`` groups of environments."""
    return replace(env, num_groups=pipeline_stages)
