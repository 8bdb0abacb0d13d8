"""A worker's vector of environments, split into independently stepped pipeline groups.

``VecEnv`` owns ``num_envs`` single gymnasium environments, split into ``num_groups`` contiguous
``EnvGroup``s (pipeline stages: the policy can act on one group while another simulates), and the
normalisation pipeline of :mod:`m2flow.envs.normalize` shared by all groups.

Why not ``gymnasium.vector.SyncVectorEnv``: it merges every sub-env's info dict into batched
arrays at every step, which costs ~15-20% of the raw MuJoCo stepping rate on a small CPU; here the
loop writes straight into arrays and gathers only the info keys asked for. The semantics are
gymnasium's same-step autoreset (``AutoresetMode.SAME_STEP``) with the final observation kept.
Async vector envs do not pay on a 2-core machine: the simulation is cheaper than the IPC.

An env whose ``step`` raises ends its episode there (reward 0, ``terminated``; the broken episode
is left out of the episode statistics) and is reset; one whose ``reset`` raises is reset again, up
to ``RESET_ATTEMPTS`` times in a row. Each exception is counted (``pop_errors``); the env worker
decides from the counts whether the run goes on (``env_worker.max_error_rate``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from m2flow.envs.config import EnvConfig
from m2flow.envs.factory import config_for_env, make_env
from m2flow.envs.normalize import ObsNormalizer, RewardScaler
from m2flow.envs.types import StepResult
from m2flow.runtime.errors import RunHealthError

logger = logging.getLogger(__name__)

# Shared empty results for the common step where no episode ended; read-only so none is mutated.
_NO_INT = np.empty(0, dtype=np.int64)
_NO_FLOAT = np.empty(0, dtype=np.float64)
_NO_INT.flags.writeable = False
_NO_FLOAT.flags.writeable = False

RESET_ATTEMPTS = 3
"""Resets of one env tried in a row before a raising ``reset`` stops the run."""


class EnvGroup:
    """A fixed set of single envs stepped together: same-step autoreset and raw episode statistics."""

    def __init__(
        self,
        envs: list[gym.Env],
        first_index: int,
        clip_actions: bool = True,
        info_keys: tuple[str, ...] = (),
        env_id: str = "",
    ) -> None:
        self.envs = envs
        self.env_id = env_id
        self.errors = 0  # exceptions raised by step or reset since the last pop_errors
        self.last_error = ""
        self.first_index = first_index
        self.num_envs = len(envs)
        self.observation_space = envs[0].observation_space
        self.action_space = envs[0].action_space
        self.info_keys = tuple(info_keys)
        self._clip = clip_actions and isinstance(self.action_space, gym.spaces.Box)
        self._discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self._ep_return = np.zeros(self.num_envs, dtype=np.float64)
        self._ep_length = np.zeros(self.num_envs, dtype=np.int64)
        self._needs_reset = True

    @property
    def indices(self) -> slice:
        """The worker-local env indices of this group."""
        return slice(self.first_index, self.first_index + self.num_envs)

    def reset(self, seeds: list[int] | None = None) -> np.ndarray:
        """Reset every env (seeded when ``seeds`` is given); raw observations (n, *obs_shape)."""
        obs = np.empty((self.num_envs, *self.observation_space.shape), self.observation_space.dtype)
        for i, env in enumerate(self.envs):
            seed = None if seeds is None else seeds[i]
            obs[i] = self._reset_env(i, seed)
            if seed is not None:
                env.action_space.seed(seed)
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        self._needs_reset = False
        return obs

    def _failed(self, i: int, what: str, error: Exception) -> None:
        self.errors += 1
        self.last_error = f"env {self.first_index + i} ({self.env_id}) {what} raised {type(error).__name__}: {error}"
        logger.warning("%s; counted (env/errors_count) and reset", self.last_error)

    def _reset_env(self, i: int, seed: int | None = None) -> np.ndarray:
        """Reset env ``i``: its first observation; a raising reset is counted and tried again."""
        for _ in range(RESET_ATTEMPTS):
            try:
                return self.envs[i].reset(seed=seed)[0]
            except Exception as error:  # noqa: BLE001 - a simulator may raise anything; counted
                self._failed(i, "reset", error)
        raise RunHealthError(f"env {self.first_index + i} ({self.env_id}) raised in reset {RESET_ATTEMPTS} times in "
                             f"a row; the last: {self.last_error}")

    def running_episodes(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the unfinished episodes' raw returns (n,) float64 and lengths (n,) int64."""
        return self._ep_return.copy(), self._ep_length.copy()

    def set_running_episodes(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        """Continue episodes part-way (a resumed run): returns (n,) and lengths (n,) so far."""
        returns, lengths = np.asarray(returns), np.asarray(lengths)
        if returns.shape != (self.num_envs,) or lengths.shape != (self.num_envs,):
            raise ValueError(f"expected running returns and lengths of shape ({self.num_envs},), "
                             f"got {returns.shape} and {lengths.shape}")
        self._ep_return[:] = returns
        self._ep_length[:] = lengths

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every env with ``actions`` (n, *action_shape); raw (unnormalised) result."""
        if self._needs_reset:
            raise RuntimeError("EnvGroup.step() before reset()")
        actions = np.asarray(actions)
        if actions.shape[0] != self.num_envs:
            raise ValueError(f"expected actions for {self.num_envs} envs, got shape {actions.shape}")
        if self._clip:
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        elif self._discrete:
            # Python ints pass the env's own action-space check far faster than numpy scalars.
            actions = actions.tolist()
        n = self.num_envs
        obs = np.empty((n, *self.observation_space.shape), self.observation_space.dtype)
        reward = np.empty(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        infos = {k: np.full(n, np.nan) for k in self.info_keys}
        finals: dict[int, np.ndarray] = {}  # env -> last obs of the episode that ended there
        broken: list[int] = []  # envs whose step raised: their episode ends without statistics
        for i, env in enumerate(self.envs):
            try:
                o, r, term, trunc, info = env.step(actions[i])
            except Exception as error:  # noqa: BLE001 - a simulator may raise anything; counted
                self._failed(i, "step", error)
                broken.append(i)
                reward[i] = 0.0
                terminated[i] = True
                obs[i] = self._reset_env(i)
                continue
            reward[i] = r
            for key in self.info_keys:
                if key in info:
                    infos[key][i] = info[key]
            if term or trunc:
                terminated[i] = term
                truncated[i] = trunc
                finals[i] = o
                o = self._reset_env(i)
            obs[i] = o
        self._ep_return += reward
        self._ep_length += 1
        if broken:
            self._ep_return[broken] = 0.0
            self._ep_length[broken] = 0
        if finals:
            next_obs = obs.copy()
            for i, o in finals.items():
                next_obs[i] = o
            ended = np.fromiter(finals, dtype=np.int64, count=len(finals))
            episode_return = self._ep_return[ended]
            episode_length = self._ep_length[ended]
            self._ep_return[ended] = 0.0
            self._ep_length[ended] = 0
        else:
            next_obs = obs
            ended, episode_return, episode_length = _NO_INT, _NO_FLOAT, _NO_INT
        return StepResult(
            obs=obs,
            next_obs=next_obs,
            reward=reward.astype(np.float32),
            raw_reward=reward,
            terminated=terminated,
            truncated=truncated,
            episode_return=episode_return,
            episode_length=episode_length,
            episode_env=ended + self.first_index,
            infos=infos,
        )

    def step_chunk(self, actions: np.ndarray, discount: float = 1.0) -> StepResult:
        """Execute a chunk of K actions per env, ``actions`` (n, K, *action_shape); raw result.

        Env i takes ``actions[i, 0]``, ``actions[i, 1]``, ... until the chunk or its episode ends (then the
        rest of its chunk is not executed; the env is reset as in :meth:`step`). An env with a
        ``step_without_render`` method (``MetaWorldPixelEnv``) takes every action but the last of a chunk
        through it: only the observation the next decision reads is rendered. ``reward`` is the discounted
        sum ``sum_j discount**j * r_j`` over the steps executed and ``env_steps`` their number; the episode
        statistics count env steps and undiscounted rewards, as :meth:`step` does; ``infos`` are the last
        executed step's.
        """
        if self._needs_reset:
            raise RuntimeError("EnvGroup.step_chunk() before reset()")
        actions = np.asarray(actions)
        n = self.num_envs
        if actions.ndim < 2 or actions.shape[0] != n:
            raise ValueError(f"expected a chunk of actions (n={n}, K, ...) , got shape {actions.shape}")
        k = actions.shape[1]
        if self._clip:
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        elif self._discrete:
            actions = actions.tolist()
        obs = np.empty((n, *self.observation_space.shape), self.observation_space.dtype)
        reward = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        steps = np.zeros(n, dtype=np.int64)
        infos = {key: np.full(n, np.nan) for key in self.info_keys}
        finals: dict[int, np.ndarray] = {}
        ended: list[tuple[int, float, int]] = []  # (env, raw return, length) of each episode that ended
        for i, env in enumerate(self.envs):
            quiet = getattr(env, "step_without_render", None)
            weight, info = 1.0, None
            for j in range(k):
                step = env.step if quiet is None or j == k - 1 else quiet
                try:
                    o, r, term, trunc, info = step(actions[i][j])
                except Exception as error:  # noqa: BLE001 - a simulator may raise anything; counted
                    self._failed(i, "step", error)
                    steps[i] += 1
                    info = None
                    terminated[i] = True  # the broken episode ends without statistics
                    self._ep_return[i], self._ep_length[i] = 0.0, 0
                    o = self._reset_env(i)
                    break
                steps[i] += 1
                reward[i] += weight * r
                weight *= discount
                self._ep_return[i] += r
                self._ep_length[i] += 1
                if term or trunc:
                    terminated[i], truncated[i] = term, trunc
                    finals[i] = o
                    ended.append((i, float(self._ep_return[i]), int(self._ep_length[i])))
                    self._ep_return[i], self._ep_length[i] = 0.0, 0
                    o = self._reset_env(i)
                    break
            if info is not None:
                for key in self.info_keys:
                    if key in info:
                        infos[key][i] = info[key]
            obs[i] = o
        next_obs = obs
        if finals:
            next_obs = obs.copy()
            for i, o in finals.items():
                next_obs[i] = o
        return StepResult(
            obs=obs, next_obs=next_obs, reward=reward.astype(np.float32), raw_reward=reward,
            terminated=terminated, truncated=truncated,
            episode_return=np.array([e[1] for e in ended], dtype=np.float64) if ended else _NO_FLOAT,
            episode_length=np.array([e[2] for e in ended], dtype=np.int64) if ended else _NO_INT,
            episode_env=(np.array([e[0] for e in ended], dtype=np.int64) if ended else _NO_INT) + self.first_index,
            infos=infos, env_steps=steps,
        )

    def close(self) -> None:
        for env in self.envs:
            env.close()


class VecEnv:
    """``num_envs`` environments of one worker rank in ``num_groups`` pipeline groups, normalised.

    Seeding: env ``i`` of rank ``r`` is reset with ``config.seed + r * num_envs + i`` on the first
    :meth:`reset`; later episodes continue each env's own random stream, so runs are reproducible.
    """

    def __init__(
        self,
        config: EnvConfig,
        rank: int = 0,
        env_maker: Callable[[EnvConfig], gym.Env] = make_env,
        episode_window: int = 1000,
    ) -> None:
        config.validate()
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        self.config = config
        self.rank = rank
        # A multi-task env_id gives env i of the worker its own task (config_for_env).
        first = rank * config.num_envs
        envs = [env_maker(config_for_env(config, first + i)) for i in range(config.num_envs)]
        self.single_observation_space = envs[0].observation_space
        self.single_action_space = envs[0].action_space
        for env in envs[1:]:
            if (env.observation_space, env.action_space) != (
                self.single_observation_space,
                self.single_action_space,
            ):
                raise ValueError(f"env_id: {config.env_id} builds envs with differing spaces")
        if config.normalize_obs and self.single_observation_space.dtype == np.uint8:
            raise ValueError(
                f"normalize_obs: {config.env_id} has image observations (uint8); set it to false "
                "(the CNN encoder scales pixels itself)"
            )
        # Contiguous, near-equal groups: group k owns envs [bounds[k], bounds[k+1]).
        bounds = np.linspace(0, config.num_envs, config.num_groups + 1).round().astype(int)
        self.groups = [
            EnvGroup(
                envs[bounds[k] : bounds[k + 1]],
                first_index=int(bounds[k]),
                clip_actions=config.clip_actions,
                info_keys=tuple(config.info_keys),
                env_id=config.env_id,
            )
            for k in range(config.num_groups)
        ]
        obs_shape = self.single_observation_space.shape
        self.obs_normalizer = (
            ObsNormalizer(obs_shape, config.clip_obs, config.norm_epsilon)
            if config.normalize_obs
            else None
        )
        self.reward_scaler = (
            RewardScaler(config.num_envs, config.gamma, config.clip_reward, config.norm_epsilon)
            if config.normalize_reward
            else None
        )
        self._float_obs = np.issubdtype(self.single_observation_space.dtype, np.floating)
        self.training = True
        self.episodes: deque[tuple[float, int]] = deque(maxlen=episode_window)
        self._seeded = False
        logger.debug(
            "rank %d: %d x %s in groups of %s", rank, config.num_envs, config.env_id,
            [g.num_envs for g in self.groups],
        )

    @property
    def num_envs(self) -> int:
        return self.config.num_envs

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def group_slice(self, k: int) -> slice:
        """The worker-local env indices of group ``k``."""
        return self.groups[k].indices

    def seeds(self) -> list[int]:
        """The first-reset seed of each env of this rank."""
        base = self.config.seed + self.rank * self.config.num_envs
        return [base + i for i in range(self.config.num_envs)]

    def set_training(self, training: bool) -> None:
        """Freeze (False) or resume (True) the normalisation statistics, e.g. for evaluation."""
        self.training = training

    def reset(self, seeds: Sequence[int] | None = None) -> np.ndarray:
        """Reset all envs; normalised observations (num_envs, *obs_shape). ``seeds`` (one per env) reseed
        them; without, the first reset seeds them with :meth:`seeds` and later ones continue their streams."""
        if seeds is not None and len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        if seeds is None and not self._seeded:
            seeds = self.seeds()
        seeds = None if seeds is None else list(seeds)
        self._seeded = True
        parts = []
        for group in self.groups:
            s = group.indices
            parts.append(group.reset(None if seeds is None else seeds[s]))
        raw = np.concatenate(parts)
        if self.reward_scaler is not None:
            self.reward_scaler.returns[:] = 0.0
        return self._normalize_obs(raw, update=self.training)

    def step_group(self, k: int, actions: np.ndarray) -> StepResult:
        """Step group ``k`` alone with ``actions`` (n_k, *action_shape); the others do not move."""
        return self._finish(k, self.groups[k].step(actions))

    def step_group_chunk(self, k: int, actions: np.ndarray, discount: float = 1.0) -> StepResult:
        """Group ``k`` alone executes a chunk of actions per env, (n_k, K, *action_shape)
        (:meth:`EnvGroup.step_chunk`). Reward normalisation scales the chunk's discounted reward as one
        reward (its running return is then over decisions, a scale estimate as good as the per-step one)."""
        return self._finish(k, self.groups[k].step_chunk(actions, discount))

    def step_chunk(self, actions: np.ndarray, discount: float = 1.0) -> StepResult:
        """Every group in turn executes its envs' chunks, ``actions`` (num_envs, K, *action_shape)."""
        return StepResult.concatenate(
            [self.step_group_chunk(k, actions[g.indices], discount) for k, g in enumerate(self.groups)])

    def _finish(self, k: int, result: StepResult) -> StepResult:
        """Group ``k``'s raw result normalised: observations, rewards, episode bookkeeping."""
        group = self.groups[k]
        ended = result.episode_env.size > 0
        done = result.terminated | result.truncated
        raw_next = result.next_obs
        result.obs = self._normalize_obs(result.obs, update=self.training)
        if ended:
            result.next_obs = result.obs.copy()
            # The last observation of an ended episode is normalised but not counted (SB3 does the same).
            result.next_obs[done] = self._normalize_obs(raw_next[done], update=False)
            self.episodes.extend(zip(result.episode_return.tolist(), result.episode_length.tolist()))
        else:
            result.next_obs = result.obs
        if self.reward_scaler is not None:
            result.reward = self.reward_scaler(
                result.raw_reward, done, group.indices, update=self.training
            )
        result.group = k
        return result

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every group in turn with ``actions`` (num_envs, *action_shape)."""
        if len(self.groups) == 1:
            return self.step_group(0, actions)
        return StepResult.concatenate(
            [self.step_group(k, actions[g.indices]) for k, g in enumerate(self.groups)]
        )

    def _normalize_obs(self, obs: np.ndarray, update: bool) -> np.ndarray:
        if self.obs_normalizer is not None:
            return self.obs_normalizer(obs, update=update)
        if self._float_obs:
            return obs.astype(np.float32, copy=False)
        return obs

    def pop_errors(self) -> tuple[int, str]:
        """(exceptions raised by any env's step or reset since the last call, the last one's message)."""
        count = sum(g.errors for g in self.groups)
        last = next((g.last_error for g in reversed(self.groups) if g.errors), "")
        for g in self.groups:
            g.errors = 0
        return count, last

    def recent_returns(self, n: int) -> list[float]:
        """Raw returns of the last ``n`` finished episodes (fewer if fewer finished)."""
        return [ret for ret, _ in list(self.episodes)[-n:]]

    def state_dict(self) -> dict[str, Any]:
        """The normalisation statistics (the checkpointable part; simulator states are not saved)."""
        return {
            "obs_normalizer": None if self.obs_normalizer is None else self.obs_normalizer.state_dict(),
            "reward_scaler": None if self.reward_scaler is None else self.reward_scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], stats_only: bool = False) -> None:
        """Restore statistics saved by :meth:`state_dict`; a piece present on one side only raises.

        ``stats_only`` skips the per-env running returns, e.g. to evaluate with the training
        statistics on a different number of envs.
        """
        for name in ("obs_normalizer", "reward_scaler"):
            piece, saved = getattr(self, name), state.get(name)
            if (piece is None) != (saved is None):
                raise ValueError(f"{name}: the checkpoint and this env disagree on whether it is enabled")
            if piece is None:
                continue
            if stats_only:
                piece.rms.load_state_dict(saved["rms"])
            else:
                piece.load_state_dict(saved)

    def close(self) -> None:
        for group in self.groups:
            group.close()
