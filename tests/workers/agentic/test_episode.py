"""The episode engine: turns, observations, masks, log-probs, rewards, budgets, failures and determinism."""

from __future__ import annotations

import pytest
import torch

from m2flow.backends.generation.hf import HFGenerationBackend
from m2flow.backends.generation.lean import LeanGenerationBackend
from m2flow.envs.text import TextEnvBatch
from m2flow.envs.text.calculator import draw_problem
from m2flow.models.tiny import TinyModelConfig, build_tiny_model
from m2flow.workers.agentic import EpisodeConfig, run_episodes, to_rollout_batch
from tests.envs.test_text_env_batch import Scripted
from tests.workers.agentic.scripted import ScriptedBackend, char_tokenizer

TOK = char_tokenizer()


def _solver(context: str) -> str:
    """Calls the calculator on the problem, then copies the result."""
    if "<result>" in context:
        return context.rsplit("<result>", 1)[1].split("</result>")[0]
    return f"<tool>calculator: {context.removesuffix('=')}</tool>"


def _calculator(n: int, **env_kwargs) -> TextEnvBatch:
    return TextEnvBatch.from_registry("calculator", n, env_kwargs=env_kwargs)


def test_a_solved_episode_has_two_model_turns_around_one_observation():
    backend = ScriptedBackend(TOK, _solver)
    (traj,), stats = run_episodes(backend, TOK, _calculator(1), [7], [0], EpisodeConfig())
    a, b = draw_problem(7)
    call, obs, answer = f"<tool>calculator: {a}*{b}</tool>", f"<result>{a * b}</result>", str(a * b)
    assert TOK.decode(traj.prompt_ids) == f"{a}*{b}="
    assert TOK.decode(traj.response_ids, skip_special_tokens=True) == call + obs + answer
    # 1 on the call and on the answer (with its end-of-sequence token), 0 on the observation.
    assert traj.action_mask == [1] * len(call) + [0] * len(obs) + [1] * (len(answer) + 1)
    assert traj.logprobs[: len(call)] == [-(k + 1) / 100 for k in range(len(call))]
    assert set(traj.logprobs[len(call): len(call) + len(obs)]) == {0.0}
    assert traj.turn_texts == [call, answer] and traj.num_turns == 2 and traj.finish_reason == "terminated"
    assert traj.turn_rewards == [0.0, 1.0] and traj.reward == 1.0
    assert traj.turn_ends == [len(call) - 1, len(traj.response_ids) - 1]
    assert stats.tool_outcomes == {"ok": 1} and stats.finish == {"terminated": 1}
    assert (stats.model_tokens, stats.observation_tokens) == (len(call) + len(answer) + 1, len(obs))
    assert backend.calls[0].stop == ("</tool>",)


def test_malformed_calls_get_an_error_observation_and_the_turn_budget_ends_the_episode():
    backend = ScriptedBackend(TOK, lambda context: "<tool>calculator 1</tool>")
    (traj,), stats = run_episodes(backend, TOK, _calculator(1, max_calls=None), [0], [0], EpisodeConfig(max_turns=3, max_tokens=1000))
    assert traj.num_turns == 3 and traj.finish_reason == "turn_budget" and traj.reward == 0.0
    assert "<error>malformed call:" in TOK.decode(traj.response_ids, skip_special_tokens=True)
    assert stats.tool_outcomes == {"malformed": 3}


def test_the_token_budget_counts_observations_and_cuts_a_turn_without_judging_it():
    backend = ScriptedBackend(TOK, _solver)
    cfg = EpisodeConfig(max_tokens=40)  # the call (~30) fits, its observation does not
    (traj,), _ = run_episodes(backend, TOK, _calculator(1), [7], [0], cfg)
    assert len(traj.response_ids) == 40 and traj.finish_reason == "token_budget" and traj.num_turns == 1
    cfg = EpisodeConfig(max_tokens=10)  # the call itself is cut: the env never sees it
    envs = _calculator(1)
    (traj,), stats = run_episodes(backend, TOK, envs, [7], [0], cfg)
    assert len(traj.response_ids) == 10 and traj.action_mask == [1] * 10 and traj.turn_rewards == []
    assert traj.finish_reason == "token_budget" and stats.env.steps == 0 and envs.running == [False]


def test_a_per_turn_cap_still_hands_the_turn_to_the_env():
    backend = ScriptedBackend(TOK, lambda context: "1234567890")
    (traj,), _ = run_episodes(backend, TOK, _calculator(1), [0], [0], EpisodeConfig(max_turn_tokens=4))
    assert traj.turn_texts == ["1234"] and traj.finish_reason == "terminated" and traj.reward == 0.0


def test_env_failures_end_only_their_trajectory():
    modes = iter(["ok", "raise", "bad_obs", "bad_reset"])
    envs = TextEnvBatch(lambda: Scripted(next(modes)), 4, name="scripted", max_error_rate=1.0)
    backend = ScriptedBackend(TOK, lambda context: "go")
    trajs, stats = run_episodes(backend, TOK, envs, [0, 1, 2, 3], [0, 0, 1, 1], EpisodeConfig())
    assert [t.finish_reason for t in trajs] == ["terminated", "env_error", "env_error", "env_error"]
    assert "raised KeyError" in trajs[1].error and "observation, not str" in trajs[2].error
    assert trajs[3].response_ids == [] and trajs[0].num_turns == 2
    assert (stats.env.raised, stats.env.bad_outputs) == (1, 2)
    batch = to_rollout_batch(trajs, TOK.pad_token_id)  # the one without a model token is left out
    assert batch.meta["traj_id"] == [0, 1, 2]


def test_the_rollout_batch_attends_to_observations_and_masks_their_loss():
    backend = ScriptedBackend(TOK, _solver)
    trajs, _ = run_episodes(backend, TOK, _calculator(3), [1, 1, 2], [0, 0, 1], EpisodeConfig(), first_traj_id=10)
    batch = to_rollout_batch(trajs, TOK.pad_token_id)
    for row, t in enumerate(trajs):
        n = len(t.response_ids)
        assert batch.response_mask[row, :n].tolist() == [1] * n and batch.response_mask[row, n:].sum() == 0
        assert batch.action_mask[row, :n].tolist() == t.action_mask and batch.action_mask[row, n:].sum() == 0
        assert torch.equal(batch.loss_mask[row], batch.action_mask[row])
    assert batch.group_ids.tolist() == [0, 0, 1] and batch.rewards.tolist() == [1.0, 1.0, 1.0]
    assert batch.meta["traj_id"] == [10, 11, 12] and not batch.truncated.any()


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="2 seeds and 1 group ids for 2 environments"):
        run_episodes(ScriptedBackend(TOK, _solver), TOK, _calculator(2), [0, 1], [0], EpisodeConfig())
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        EpisodeConfig(max_turns=0)


def _tiny_run(seed: int, backend_class=LeanGenerationBackend):
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, seed=0), TOK)
    backend = backend_class(model, TOK)
    envs = TextEnvBatch.from_registry("guess_number", 4, env_kwargs={"high": 20, "max_turns": 3})
    return run_episodes(backend, TOK, envs, [5, 5, 6, 6], [0, 0, 1, 1],
                        EpisodeConfig(max_turns=3, max_turn_tokens=6, max_tokens=40, seed=seed))[0]


def test_a_real_model_plays_the_same_episodes_for_the_same_seed():
    first, again, other = _tiny_run(0), _tiny_run(0), _tiny_run(1)
    key = [(t.response_ids, t.action_mask, t.turn_rewards, t.finish_reason) for t in first]
    assert key == [(t.response_ids, t.action_mask, t.turn_rewards, t.finish_reason) for t in again]
    assert key != [(t.response_ids, t.action_mask, t.turn_rewards, t.finish_reason) for t in other]
    for t in first:
        assert len(t.response_ids) == len(t.action_mask) == len(t.logprobs) <= 40
        assert all(lp < 0 for lp, m in zip(t.logprobs, t.action_mask) if m)  # real log-probs on model tokens
        assert t.num_turns <= 3


def test_the_hf_backend_plays_the_same_episodes_as_the_lean_one():
    lean, hf = _tiny_run(0), _tiny_run(0, HFGenerationBackend)
    assert [(t.response_ids, t.action_mask, t.finish_reason) for t in lean] == [
        (t.response_ids, t.action_mask, t.finish_reason) for t in hf]
    for a, b in zip(lean, hf):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
