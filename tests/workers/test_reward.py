"""The reward worker: scores per response, DAPO shaping and filtering, counts, everything passed on."""

from __future__ import annotations

import pytest
import torch

from m2flow.data.batch import RolloutBatch
from m2flow.rewards.registry import RewardEntry, RewardFunction
from m2flow.rewards.sandbox import VerifyStats
from m2flow.runtime.errors import RunHealthError
from m2flow.workers.config import RewardConfig
from m2flow.workers.messages import GroupSample
from m2flow.workers.reward import RewardSettings, RewardWorker, build_reward_fn
from tests.workers.harness import MemoryStream, local_worker


def _group(slot: int, texts: list[str], lengths: list[int], answer: str = "19") -> GroupSample:
    width = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    batch = RolloutBatch(
        prompt_ids=torch.ones(len(texts), 2, dtype=torch.long), prompt_mask=torch.ones(len(texts), 2, dtype=torch.long),
        response_ids=torch.ones_like(mask), response_mask=mask, group_ids=torch.full((len(texts),), slot),
        truncated=torch.zeros(len(texts), dtype=torch.bool))
    return GroupSample(step=0, slot=slot, index=slot, answer=answer, texts=texts, batch=batch)


def _worker(cfg: RewardConfig, groups: list[GroupSample], **kwargs) -> tuple[RewardWorker, MemoryStream]:
    inp, out = MemoryStream(), MemoryStream()
    for g in groups:
        inp.put(g)
    return local_worker(RewardWorker, settings=RewardSettings(reward=cfg, max_new_tokens=8, responses=inp, scored=out,
                                                                   **kwargs)), out


def test_math_rewards_each_response_and_passes_every_group_on():
    groups = [_group(0, ["19", "#### 19", "18"], [2, 7, 2]), _group(1, ["7", "x"], [1, 1], answer="7")]
    worker, out = _worker(RewardConfig(fn="math", timeout_s=2.0), groups)
    m = worker.score(0, 2)
    got = out.take(0, 2)
    assert [g.batch.rewards.tolist() for g in got] == [[1.0, 1.0, 0.0], [1.0, 0.0]]
    assert m["reward/mean"] == pytest.approx(3 / 5) and m["reward/solved_frac"] == pytest.approx(3 / 5)
    assert m["reward/timeouts_count"] == 0 and m["_weight"] == 5


def test_overlong_penalty_is_added_and_constant_groups_are_dropped():
    cfg = RewardConfig(fn="tests.workflows.toy_reward:target_fraction", overlong_buffer=4, overlong_penalty=1.0)
    # max_new_tokens 8, buffer 4: no penalty up to 4 tokens, then -0.25 per token, -1 at 8.
    groups = [_group(0, ["77", "7777"], [2, 6]), _group(1, ["1", "2"], [1, 1])]
    worker, out = _worker(cfg, groups, dynamic_sampling=True)
    m = worker.score(0, 2)
    first, second = out.take(0, 2)
    assert first.batch.rewards.tolist() == pytest.approx([1.0, 1.0 - 0.5])
    assert not first.dropped
    assert second.dropped and second.batch.rewards.tolist() == [0.0, 0.0]
    assert m["reward/dropped_groups_count"] == 1 and m["reward/score_mean"] == pytest.approx(0.5)


def test_math_reward_uses_the_configured_time_limit_and_timeouts_are_counted():
    fn = build_reward_fn(RewardConfig(fn="math", timeout_s=0.25))
    assert fn.entry.fn.keywords["timeout_s"] == 0.25

    def slow_checks(responses, references):  # as score_batch reports a check killed at its limit
        return [0.0] * len(responses), VerifyStats(total=len(responses), sandboxed=1, timeouts=1)

    worker, out = _worker(RewardConfig(fn="math", max_error_rate=1.0), [_group(0, ["\\sqrt{8}", "2"], [3, 1], answer="2\\sqrt{2}")])
    worker.scorer.fn = RewardFunction("math", RewardEntry(slow_checks, batched=True, returns_stats=True))
    m = worker.score(0, 1)
    assert m["reward/timeouts_count"] == 1 and out.take(0, 1)[0].batch.rewards.tolist() == [0.0, 0.0]


FLAKY = "tests.rewards.reward_fns:flaky_reward"


def test_a_user_reward_runs_under_the_time_limit_and_each_failure_is_counted_by_kind():
    texts = ["ok", "slow", "bad", "nan", "inf", "die", "ok"]
    worker, out = _worker(RewardConfig(fn=FLAKY, timeout_s=0.5, max_error_rate=1.0),
                          [_group(0, texts, [2] * len(texts))])
    m = worker.score(0, 1)
    assert out.take(0, 1)[0].batch.rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert (m["reward/timeouts_count"], m["reward/errors_count"], m["reward/crashes_count"],
            m["reward/invalid_count"]) == (1, 1, 1, 2)
    assert m["reward/error_rate"] == pytest.approx(5 / 7)


def test_a_batched_user_reward_that_sleeps_scores_zero_at_its_limit():
    cfg = RewardConfig(fn="tests.rewards.reward_fns:sleeping_batch_reward", timeout_s=0.5, max_error_rate=1.0)
    worker, out = _worker(cfg, [_group(0, ["a", "b", "c"], [1, 1, 1])])
    m = worker.score(0, 1)
    assert out.take(0, 1)[0].batch.rewards.tolist() == [0.0, 0.0, 0.0]
    assert m["reward/timeouts_count"] == 3 and m["reward/errors_count"] == 0


def test_past_the_error_rate_the_scorer_stops_with_one_clear_error():
    texts = ["ok"] * 9 + ["bad"]
    worker, _ = _worker(RewardConfig(fn=FLAKY, max_error_rate=0.1), [_group(0, texts, [2] * 10)])
    assert worker.score(0, 1)["reward/errors_count"] == 1  # 1 of 10: at the limit, not past it
    worker, _ = _worker(RewardConfig(fn=FLAKY, max_error_rate=0.1), [_group(0, texts[1:] + ["bad"], [2] * 10)])
    with pytest.raises(RunHealthError, match=r"2 of 10 reward checks failed in iteration 0 \(0 timed out, 2 raised"):
        worker.score(0, 1)


def test_an_unisolated_reward_runs_in_the_worker_process_with_the_same_scores_and_counts():
    import os

    texts = ["ok", "bad", "nan", "inf", "ok"]
    worker, out = _worker(RewardConfig(fn=FLAKY, isolate=False, max_error_rate=1.0), [_group(0, texts, [2] * 5)])
    m = worker.score(0, 1)
    assert out.take(0, 1)[0].batch.rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]  # as sandboxed
    assert (m["reward/errors_count"], m["reward/invalid_count"], m["reward/timeouts_count"]) == (1, 2, 0)
    here = float(os.getpid())
    inline, _ = _worker(RewardConfig(fn="tests.rewards.reward_fns:pid_reward", isolate=False), [_group(0, ["a"], [1])])
    inline.score(0, 1)
    sandboxed, out = _worker(RewardConfig(fn="tests.rewards.reward_fns:pid_reward"), [_group(0, ["a"], [1])])
    sandboxed.score(0, 1)
    assert inline.scorer.raw == [here] and out.take(0, 1)[0].batch.rewards.item() != here


def test_an_unisolated_batched_and_math_reward_count_in_process():
    fn = build_reward_fn(RewardConfig(fn="tests.rewards.reward_fns:batched_length_reward", isolate=False))
    assert fn(["ab", "abc"], ["", ""]) == [2.0, 3.0]
    stats = fn.pop_stats()
    assert (stats.total, stats.in_process, stats.sandboxed) == (2, 2, 0)
    math_fn = build_reward_fn(RewardConfig(fn="math", isolate=False))
    assert math_fn(["\\frac{1}{2}", "0.5", "3"], ["1/2", "\\frac12", "4"]) == [1.0, 1.0, 0.0]
    stats = math_fn.pop_stats()
    assert (stats.total, stats.sandboxed, stats.failures) == (3, 0, 0)
