from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from m2flow.envs import EnvConfig, VecEnv, available_env_backends, register_env_backend
from m2flow.envs.factory import make_env

SCRIPTED_ID = "M2flowTest/Scripted-v0"
TIME_LIMIT = 5


class ScriptedEnv(gym.Env):
    """obs = (t, seed marker); reward = t after the t-th step; terminates after ``terminate_at`` steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, terminate_at: int | None = None) -> None:
        self.terminate_at = terminate_at
        self.t = 0
        self.marker = 0.0
        self.actions: list[np.ndarray] = []

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.marker], dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.marker = float(self.np_random.uniform())
        return self._obs(), {}

    def step(self, action):
        self.actions.append(np.array(action))
        self.t += 1
        terminated = self.terminate_at is not None and self.t == self.terminate_at
        return self._obs(), float(self.t), terminated, False, {"t": self.t}


@pytest.fixture(scope="module", autouse=True)
def scripted_env_registered():
    gym.register(id=SCRIPTED_ID, entry_point=ScriptedEnv, max_episode_steps=TIME_LIMIT)
    yield
    del gym.registry[SCRIPTED_ID]


def raw_config(**overrides) -> EnvConfig:
    base = dict(env_id=SCRIPTED_ID, num_envs=2, normalize_obs=False, normalize_reward=False)
    return EnvConfig(**{**base, **overrides})


def test_truncation_keeps_final_obs_and_bootstraps():
    env = VecEnv(raw_config())
    env.reset()
    for _ in range(TIME_LIMIT - 1):
        res = env.step(np.zeros((2, 1)))
        assert not res.done.any()
        np.testing.assert_array_equal(res.next_obs, res.obs)
    res = env.step(np.zeros((2, 1)))
    np.testing.assert_array_equal(res.truncated, [True, True])
    np.testing.assert_array_equal(res.terminated, [False, False])
    np.testing.assert_array_equal(res.next_obs[:, 0], [TIME_LIMIT, TIME_LIMIT])  # true last obs
    np.testing.assert_array_equal(res.obs[:, 0], [0, 0])  # already the next episode
    # One-step TD target with V(obs) = obs[0]: bootstrap from the true last obs on truncation.
    gamma, value = 0.9, lambda o: o[:, 0]
    target = res.raw_reward + gamma * value(res.next_obs) * res.bootstrap
    np.testing.assert_allclose(target, [TIME_LIMIT + gamma * TIME_LIMIT] * 2)


def test_termination_never_bootstraps_even_at_the_time_limit():
    # Env 0 terminates at step 2; env 1 terminates exactly at the time limit (both flags set).
    makers = iter([2, TIME_LIMIT])
    env = VecEnv(
        raw_config(),
        env_maker=lambda cfg: gym.make(SCRIPTED_ID, terminate_at=next(makers), disable_env_checker=True),
    )
    env.reset()
    env.step(np.zeros((2, 1)))
    res = env.step(np.zeros((2, 1)))
    np.testing.assert_array_equal(res.terminated, [True, False])
    assert not res.bootstrap.any()
    np.testing.assert_array_equal(res.next_obs[0], [2, res.next_obs[0, 1]])
    for _ in range(TIME_LIMIT - 2):
        res = env.step(np.zeros((2, 1)))
    assert res.terminated[1] and res.truncated[1]
    assert not res.bootstrap[1]


def test_episode_statistics_are_exact():
    lengths = {0: 2, 1: 3, 2: None}  # env 2 runs into the time limit
    counter = iter(range(3))
    env = VecEnv(
        raw_config(num_envs=3, num_groups=1),
        env_maker=lambda cfg: gym.make(
            SCRIPTED_ID, terminate_at=lengths[next(counter)], disable_env_checker=True
        ),
    )
    env.reset()
    finished = []
    for step in range(1, 7):
        res = env.step(np.zeros((3, 1)))
        finished += [(step, int(e), float(r), int(n)) for e, r, n in zip(
            res.episode_env, res.episode_return, res.episode_length
        )]
    # Reward at the t-th step of an episode is t, so an episode of length L returns L(L+1)/2.
    assert finished == [
        (2, 0, 3.0, 2),
        (3, 1, 6.0, 3),
        (4, 0, 3.0, 2),
        (5, 2, 15.0, 5),
        (6, 0, 3.0, 2),
        (6, 1, 6.0, 3),
    ]
    assert env.recent_returns(2) == [3.0, 6.0]



def test_running_episodes_carry_over_to_a_restored_group():
    make = lambda cfg: gym.make(SCRIPTED_ID, terminate_at=None, disable_env_checker=True)  # noqa: E731
    env = VecEnv(raw_config(num_envs=2, num_groups=1), env_maker=make)
    env.reset()
    for _ in range(3):
        env.step(np.zeros((2, 1)))
    group = env.groups[0]
    returns, lengths = group.running_episodes()
    assert returns.tolist() == [6.0, 6.0] and lengths.tolist() == [3, 3]  # rewards 1 + 2 + 3
    returns[:] = -1.0  # a copy: the group's own counts are untouched
    assert group.running_episodes()[0].tolist() == [6.0, 6.0]
    restored = VecEnv(raw_config(num_envs=2, num_groups=1), env_maker=make)
    restored.reset()
    restored.groups[0].set_running_episodes(np.array([6.0, 6.0]), np.array([3, 3]))
    for _ in range(TIME_LIMIT):  # the fresh envs' own time limit ends the episodes after 5 more steps
        res = restored.step(np.zeros((2, 1)))
    assert res.episode_return.tolist() == [6.0 + 15.0] * 2 and res.episode_length.tolist() == [3 + 5] * 2
    with pytest.raises(ValueError, match="shape"):
        group.set_running_episodes(np.zeros(3), np.zeros(3))

def test_seeding_per_rank_is_reproducible():
    cfg = raw_config(num_envs=3, seed=10)
    first = [VecEnv(cfg, rank=r) for r in (0, 1)]
    again = VecEnv(cfg, rank=1)
    assert first[1].seeds() == [13, 14, 15]
    markers = {r: e.reset()[:, 1] for r, e in enumerate(first)}
    np.testing.assert_array_equal(again.reset()[:, 1], markers[1])
    assert not np.intersect1d(markers[0], markers[1]).size
    reference = gym.make(SCRIPTED_ID)
    assert np.float32(reference.reset(seed=14)[0][1]) == markers[1][1]
    # Later episodes continue each env's stream: identical across identical runs.
    for _ in range(TIME_LIMIT):
        a, b = first[1].step(np.zeros((3, 1))), again.step(np.zeros((3, 1)))
    np.testing.assert_array_equal(a.obs, b.obs)
    assert not np.array_equal(a.obs[:, 1], markers[1])


def test_step_group_moves_only_that_group():
    env = VecEnv(raw_config(num_envs=5, num_groups=2))
    assert [env.group_slice(k) for k in range(2)] == [slice(0, 2), slice(2, 5)]
    env.reset()
    res = env.step_group(1, np.zeros((3, 1)))
    assert res.group == 1 and res.obs.shape == (3, 2)
    res = env.step_group(1, np.zeros((3, 1)))
    steps = [e.unwrapped.t for g in env.groups for e in g.envs]
    assert steps == [0, 0, 2, 2, 2]
    with pytest.raises(ValueError, match="3 envs"):
        env.step_group(1, np.zeros((2, 1)))


def test_actions_clipped_to_bounds_and_info_keys_gathered():
    env = VecEnv(raw_config(info_keys=["t", "missing"]))
    env.reset()
    res = env.step(np.array([[3.0], [-0.5]]))
    seen = [g.envs[i].unwrapped.actions[-1] for g in env.groups for i in range(g.num_envs)]
    np.testing.assert_array_equal(np.concatenate(seen), [1.0, -0.5])
    np.testing.assert_array_equal(res.infos["t"], [1, 1])
    assert np.isnan(res.infos["missing"]).all()


def test_normalisation_in_the_pipeline_round_trips_and_freezes():
    cfg = raw_config(num_envs=4, num_groups=2, normalize_obs=True, normalize_reward=True)
    env = VecEnv(cfg)
    obs = env.reset()
    assert obs.dtype == np.float32
    for k in range(6):
        env.step_group(k % 2, np.zeros((2, 1)))
    state = env.state_dict()
    twin = VecEnv(cfg)
    twin.load_state_dict(state)
    probe = np.array([[1.0, 0.5], [3.0, 0.1]])
    np.testing.assert_array_equal(
        twin.obs_normalizer.normalize(probe), env.obs_normalizer.normalize(probe)
    )
    np.testing.assert_array_equal(twin.reward_scaler.returns, env.reward_scaler.returns)
    # Frozen statistics do not move while stepping (evaluation).
    env.set_training(False)
    count = env.obs_normalizer.rms.count
    returns = env.reward_scaler.returns.copy()
    res = env.step_group(0, np.zeros((2, 1)))
    assert env.obs_normalizer.rms.count == count
    np.testing.assert_array_equal(env.reward_scaler.returns, returns)
    assert res.reward.dtype == np.float32
    # An eval env with a different env count takes the statistics only.
    small = VecEnv(raw_config(num_envs=1, normalize_obs=True, normalize_reward=True))
    with pytest.raises(ValueError, match="envs"):
        small.load_state_dict(state)
    small.load_state_dict(state, stats_only=True)
    assert small.obs_normalizer.rms.count == state["obs_normalizer"]["rms"]["count"]
    with pytest.raises(ValueError, match="obs_normalizer"):
        VecEnv(raw_config()).load_state_dict(state)


def test_obs_statistics_count_reset_obs_but_not_final_obs():
    env = VecEnv(raw_config(num_envs=2, normalize_obs=True, clip_obs=100.0, norm_epsilon=1e-12))
    env.reset()
    for _ in range(TIME_LIMIT):
        res = env.step(np.zeros((2, 1)))
    # Counted per env: t = 0 (reset), 1, 2, 3, 4, then 0 again (autoreset); the final t = 5 is not.
    seen_t = np.array([0, 1, 2, 3, 4, 0], dtype=np.float64)
    rms = env.obs_normalizer.rms
    assert rms.count == 12
    assert rms.mean[0] == pytest.approx(seen_t.mean())
    assert rms.var[0] == pytest.approx(seen_t.var())
    expected_final = (TIME_LIMIT - seen_t.mean()) / seen_t.std()
    np.testing.assert_allclose(res.next_obs[:, 0], [expected_final] * 2, rtol=1e-6)
    np.testing.assert_allclose(res.obs[:, 0], [-seen_t.mean() / seen_t.std()] * 2, rtol=1e-6)


def test_bad_env_id_and_config_fail_fast():
    with pytest.raises(ValueError, match=r"env_id: 'HalfCheeta-v5'.*HalfCheetah-v5"):
        VecEnv(EnvConfig(env_id="HalfCheeta-v5"))
    with pytest.raises(ValueError, match="num_groups"):
        VecEnv(raw_config(num_envs=2, num_groups=3))
    with pytest.raises(ValueError, match=r"unknown env backend 'nope'.*gymnasium"):
        make_env(raw_config(backend="nope"))
    assert {"gymnasium", "maniskill"} <= set(available_env_backends())
    with pytest.raises(ValueError, match="already registered"):
        register_env_backend("gymnasium")(lambda cfg: None)


def test_spaces_of_a_backend_without_its_own_come_from_a_probe_env():
    from m2flow.envs.factory import env_spaces

    obs_space, act_space = env_spaces(EnvConfig(env_id="CartPole-v1"))
    assert obs_space.shape == (4,) and act_space.n == 2


def test_mujoco_halfcheetah_steps_without_writing_a_log(tmp_path):
    env = VecEnv(EnvConfig(env_id="HalfCheetah-v5", num_envs=2, num_groups=2, max_episode_steps=3))
    obs = env.reset()
    assert obs.shape == (2, 17)
    for _ in range(3):
        res = env.step(np.ones((2, 6)) * 2.0)
    assert res.truncated.all() and not res.terminated.any()
    assert res.episode_length.tolist() == [3, 3]
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    env.close()


def test_discrete_cartpole_actions():
    env = VecEnv(EnvConfig(env_id="CartPole-v1", num_envs=3, normalize_obs=False))
    obs = env.reset()
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    res = env.step(np.array([0, 1, 0]))
    assert res.reward.shape == (3,)


def test_pixel_observations_refuse_obs_normalisation():
    class Pixels(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros((8, 8, 3), np.uint8), {}

        def step(self, action):
            return np.full((8, 8, 3), 7, np.uint8), 1.0, False, False, {}

    with pytest.raises(ValueError, match="normalize_obs"):
        VecEnv(raw_config(normalize_obs=True), env_maker=lambda cfg: Pixels())
    env = VecEnv(raw_config(num_envs=2), env_maker=lambda cfg: Pixels())
    assert env.reset().dtype == np.uint8
    res = env.step(np.array([0, 1]))
    assert res.obs.dtype == np.uint8 and res.obs.shape == (2, 8, 8, 3)
