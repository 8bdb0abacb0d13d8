"""The turn engine: episodes started from given observations, re-run from their start (played by the turn loop
over environments that are lost once), seeded per episode with a continuous-batching backend so a re-run
plays as it first did."""

from __future__ import annotations

import pytest

from m2flow.backends.generation.lean import LeanGenerationBackend
from m2flow.envs.text import TextEnvBatch
from m2flow.models.tiny import TinyModelConfig, build_tiny_model
from m2flow.workers.agentic.env_worker import EnvsInProcess, TextEnvs
from m2flow.workers.agentic.turn_loop import play_turns
from m2flow.workers.agentic.turns import EpisodeConfig, EpisodeSpec, TurnEngine
from tests.workers.agentic.scripted import char_tokenizer

TOK = char_tokenizer()


class _SeededEngine:
    """The engine as the turn loop's policy side, each episode's turn seeded by its own (seed, id, turn)."""

    def __init__(self, engine: TurnEngine, backend) -> None:
        self.engine, self.backend = engine, backend
        self.start_episodes, self.observe, self.rerun = engine.begin, engine.observe, engine.rerun

    def play_turn(self, round_: int):
        return self.engine.turn(self.backend, seed=round_, seed_base=3)


class _LosingEnvs(EnvsInProcess):
    """Environments in this process that are all lost at step call ``lose_at``: no answer (a dead env worker);
    the turn loop resets the episodes that were running on them again."""

    def __init__(self, envs: TextEnvBatch, specs, lose_at: int | None) -> None:
        super().__init__(TextEnvs(envs), {s.traj_id: s.seed for s in specs})
        self.lose_at, self.calls = lose_at, 0

    def step(self, actions):
        self.calls += 1
        if self.calls - 1 == self.lose_at:
            return {}, list(actions)
        return super().step(actions)


def _play(engine: TurnEngine, envs: TextEnvBatch, backend, specs, lose_after: int | None = None) -> int:
    """Play every episode to its end through the turn loop; with ``lose_after`` every environment is lost in
    the round after that many rounds, and the episodes still running start over once. Returns the rounds."""
    return play_turns(_SeededEngine(engine, backend), _LosingEnvs(envs, specs, lose_after),
                      [s.traj_id for s in specs]).rounds


def test_a_re_run_episode_plays_as_it_first_did():
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, seed=0), TOK)
    backend = LeanGenerationBackend(model, TOK)
    cfg = EpisodeConfig(max_turns=4, max_tokens=40, max_turn_tokens=3, stop=(" ",), temperature=1.0)
    specs = [EpisodeSpec(10 + i, i // 2, i // 2, i) for i in range(4)]

    def run(lose_after):
        envs = TextEnvBatch.from_registry("guess_number", 4, env_kwargs={"high": 8, "max_turns": 4})
        engine = TurnEngine(cfg, TOK, specs)
        rounds = _play(engine, envs, backend, specs, lose_after)
        return [engine.trajectory(s.traj_id) for s in specs], engine.close(), rounds, engine.reruns

    calm, _, calm_rounds, _ = run(None)
    lost, stats, rounds, reruns = run(1)
    assert reruns > 0 and rounds > calm_rounds and stats.trajectories == 4
    for a, b in zip(calm, lost):
        assert (a.response_ids, a.action_mask, a.turn_rewards, a.finish_reason) == \
            (b.response_ids, b.action_mask, b.turn_rewards, b.finish_reason)


def test_an_ended_episode_is_not_re_run_and_closing_needs_every_episode_ended():
    engine = TurnEngine(EpisodeConfig(), TOK, [EpisodeSpec(0, 0, 0, 0), EpisodeSpec(1, 0, 0, 0)])
    from m2flow.envs.text.batch import EnvStep

    ended = engine.begin({0: EnvStep("", error="reset raised"), 1: EnvStep("1*2=")})
    assert ended == [0] and engine.running() == [1]
    with pytest.raises(ValueError, match="trajectory 0 has ended"):
        engine.rerun([0])
    with pytest.raises(RuntimeError, match="have not ended"):
        engine.close()


def test_keeping_each_episodes_cache_across_turns_plays_the_same_episodes():
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, seed=2), TOK)
    backend = LeanGenerationBackend(model, TOK)
    specs = [EpisodeSpec(i, i // 2, i // 2, i) for i in range(6)]

    def run(reuse_kv):
        cfg = EpisodeConfig(max_turns=4, max_tokens=40, max_turn_tokens=4, stop=(" ",), temperature=1.0,
                            reuse_kv=reuse_kv)
        envs = TextEnvBatch.from_registry("guess_number", 6, env_kwargs={"high": 8, "max_turns": 4})
        engine = TurnEngine(cfg, TOK, specs)
        rounds = _play(engine, envs, backend, specs, lose_after=2)  # a re-run on the way
        return [engine.trajectory(s.traj_id) for s in specs], rounds

    (kept, rounds), (whole, whole_rounds) = run(True), run(False)
    assert rounds == whole_rounds >= 3
    for a, b in zip(kept, whole):
        assert (a.response_ids, a.action_mask, a.turn_texts, a.finish_reason) == \
            (b.response_ids, b.action_mask, b.turn_texts, b.finish_reason)
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
