"""Tiny gymnasium envs for the embodied tests; importing this module registers them.

- ``M2flowToy/ContextMatch-v0``: one of 4 contexts shown one-hot; the matching action earns 1 and
  the episode goes on, any other ends it (terminated); 8 correct steps in a row end it by the time
  limit (truncated). A random policy scores about 0.33, the best one 8; PPO learns it in seconds.
- ``M2flowToy/Target-v0``: continuous; the observation is a target in [-1, 1] and the reward
  1 - |action - target|; episodes last 8 steps (truncated).
- ``M2flowToy/Counter-v0``: the observation is (env id, steps this env has taken), so every
  transition names itself; episodes are truncated after 5 steps and terminated whenever the step
  count reaches a multiple of 7.
- ``M2flowToy/Flaky-v0``: ContextMatch whose ``step`` raises on every ``step_every``-th step of an
  env and whose ``reset`` raises on every ``reset_every``-th reset (0: never), as a flaky simulator would.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

CONTEXTS = 4


class ContextMatchEnv(gym.Env):
    observation_space = spaces.Box(0.0, 1.0, (CONTEXTS,), np.float32)
    action_space = spaces.Discrete(CONTEXTS)

    def _obs(self) -> np.ndarray:
        obs = np.zeros(CONTEXTS, dtype=np.float32)
        obs[self.context] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.context = int(self.np_random.integers(CONTEXTS))
        return self._obs(), {}

    def step(self, action):
        hit = int(action) == self.context
        self.context = int(self.np_random.integers(CONTEXTS))
        return self._obs(), float(hit), not hit, False, {"is_success": float(hit)}


class TargetEnv(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Box(-2.0, 2.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-1.0, 1.0, size=1).astype(np.float32)
        return self.target.copy(), {}

    def step(self, action):
        reward = 1.0 - float(abs(float(np.asarray(action).reshape(-1)[0]) - self.target[0]))
        self.target = self.np_random.uniform(-1.0, 1.0, size=1).astype(np.float32)
        return self.target.copy(), reward, False, False, {}


class CounterEnv(gym.Env):
    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self) -> None:
        self.uid = -1
        self.count = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.uid, self.count], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.uid = seed  # the first reset is seeded with the env's own seed
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        return self._obs(), float(self.count), self.count % 7 == 0, False, {}


class SimulatorError(RuntimeError):
    """What the flaky env raises."""


class FlakyEnv(ContextMatchEnv):
    def __init__(self, step_every: int = 0, reset_every: int = 0) -> None:
        self.step_every, self.reset_every = step_every, reset_every
        self.steps = self.resets = 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        if self.reset_every and self.resets % self.reset_every == 0:
            raise SimulatorError(f"reset {self.resets} failed")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.step_every and self.steps % self.step_every == 0:
            raise SimulatorError(f"step {self.steps} failed")
        return super().step(action)


def _register(env_id: str, entry: str, steps: int) -> None:
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=f"{__name__}:{entry}", max_episode_steps=steps)


_register("M2flowToy/ContextMatch-v0", "ContextMatchEnv", 8)
_register("M2flowToy/Target-v0", "TargetEnv", 8)
_register("M2flowToy/Counter-v0", "CounterEnv", 5)
_register("M2flowToy/Flaky-v0", "FlakyEnv", 8)
