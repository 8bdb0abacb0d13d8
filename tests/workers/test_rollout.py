"""The rollout worker: n responses per prompt, groups emitted per chunk, sampling seeded by step."""

from __future__ import annotations

import pytest
import torch

from m2flow.workers.config import RolloutConfig, SamplingConfig
from m2flow.workers.messages import PromptTask
from m2flow.workers.rollout import RolloutWorker
from tests.workers.harness import MemoryStream, local_worker, rollout_settings

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [6]]


def _generate(ckpt: str, step: int, seed: int = 0, chunk: int | None = None, n: int = 3, backend: str = "hf"):
    prompts, out = MemoryStream(), MemoryStream()
    cfg = RolloutConfig(backend=backend, sampling=SamplingConfig(n=n, max_new_tokens=5), prompts_per_chunk=chunk)
    worker = local_worker(RolloutWorker, settings=rollout_settings(ckpt, cfg, prompts, out, seed=seed))
    for slot, ids in enumerate(PROMPTS):
        prompts.put(PromptTask(step, slot, 100 + slot, ids, str(slot)))
    metrics = worker.generate(step, len(PROMPTS))
    return out.take(0, len(PROMPTS)), metrics


def test_each_prompt_becomes_a_group_of_n_with_its_slot_and_answer(tiny_ckpt):
    groups, metrics = _generate(tiny_ckpt, step=0, chunk=3)
    assert [(g.slot, g.index, g.answer, g.size) for g in groups] == [(k, 100 + k, str(k), 3) for k in range(4)]
    for g, prompt in zip(groups, PROMPTS):
        b = g.batch
        assert (b.group_ids == g.slot).all() and len(g.texts) == 3
        # Prompts are left-padded: the real tokens end the row.
        assert b.prompt_ids[0, -len(prompt):].tolist() == prompt
        assert (b.response_mask.sum(-1) >= 1).all() and b.rollout_logprobs.shape == b.response_ids.shape
    assert metrics["rollout/responses_count"] == 12


def test_sampling_depends_on_seed_and_step_only(tiny_ckpt):
    def ids(groups):
        return [g.batch.response_ids.tolist() for g in groups]

    a, _ = _generate(tiny_ckpt, step=3, seed=1)
    b, _ = _generate(tiny_ckpt, step=3, seed=1)
    c, _ = _generate(tiny_ckpt, step=4, seed=1)
    assert ids(a) == ids(b) and ids(a) != ids(c)


def test_the_lean_backend_draws_the_hf_backends_groups(tiny_ckpt):
    hf, hf_metrics = _generate(tiny_ckpt, step=2, seed=1, chunk=3)
    lean, lean_metrics = _generate(tiny_ckpt, step=2, seed=1, chunk=3, backend="lean")
    assert [(g.slot, g.texts, g.batch.response_ids.tolist()) for g in lean] == [
        (g.slot, g.texts, g.batch.response_ids.tolist()) for g in hf]
    for g, h in zip(lean, hf):
        assert torch.allclose(g.batch.rollout_logprobs, h.batch.rollout_logprobs, atol=1e-5)
    assert lean_metrics["rollout/tokens_count"] == hf_metrics["rollout/tokens_count"]


def test_weights_digest_changes_with_the_weights(tiny_ckpt):
    prompts, out = MemoryStream(), MemoryStream()
    worker = local_worker(RolloutWorker, settings=rollout_settings(tiny_ckpt, RolloutConfig(), prompts, out))
    before = worker.weights_digest()
    with torch.no_grad():
        next(worker.backend.model.parameters()).add_(1e-3)
    assert worker.weights_digest() != before


def test_a_fused_scorer_sends_the_groups_on_scored_with_the_reward_metrics(tiny_ckpt):
    from m2flow.workers.config import RewardConfig
    from m2flow.workers.reward import RewardSettings

    prompts, out = MemoryStream(), MemoryStream()
    cfg = RolloutConfig(sampling=SamplingConfig(n=3, max_new_tokens=5), prompts_per_chunk=3)
    # The toy reward scores the fraction of '7' characters in a response.
    reward = RewardSettings(reward=RewardConfig(fn="tests.workflows.toy_reward:target_fraction"), max_new_tokens=5)
    worker = local_worker(RolloutWorker, settings=rollout_settings(tiny_ckpt, cfg, prompts, out, seed=0),
                          hosted={"reward": reward})
    for step in (0, 1):
        for slot, ids in enumerate(PROMPTS):
            prompts.put(PromptTask(step, slot, 100 + slot, ids, str(slot)))
        metrics = worker.generate(step, len(PROMPTS))
        groups = out.take(0, len(PROMPTS))
        rewards = [r for g in groups for r in g.batch.rewards.tolist()]
        expected = [t.count("7") / max(1, len(t)) for g in groups for t in g.texts]
        assert rewards == pytest.approx(expected)
        # The iteration's metrics cover this iteration's 12 responses only.
        assert metrics["_weight"] == 12 and metrics["reward/mean"] == pytest.approx(sum(expected) / 12)
        assert metrics["rollout/responses_count"] == 12 and metrics["reward/dropped_groups_count"] == 0


class _TimedStream(MemoryStream):
    """A MemoryStream that notes when each put happened."""

    def __init__(self, consumers: int = 1) -> None:
        super().__init__(consumers)
        self.put_times: list[tuple[float, list[int]]] = []

    def put_many(self, items):
        import time

        items = list(items)
        self.put_times.append((time.perf_counter(), [i.slot for i in items]))
        super().put_many(items)


def _continuous(ckpt, step, *, max_running=256, ranks=1, prompts=PROMPTS, seed=0):
    """Groups (by slot) of a continuous-batching lean rollout over ``ranks`` ranks, and the last rank's out stream."""
    cfg = RolloutConfig(backend="lean", sampling=SamplingConfig(n=3, max_new_tokens=5), max_running=max_running)
    groups = {}
    for rank in range(ranks):
        inp, out = MemoryStream(ranks), _TimedStream()
        worker = local_worker(RolloutWorker, rank=rank, world_size=ranks,
                              settings=rollout_settings(ckpt, cfg, inp, out, seed=seed))
        assert worker.generation.batching == "continuous"  # 'auto' resolves to it for the lean backend
        for slot, ids in enumerate(prompts):
            inp.put(PromptTask(step, slot, 100 + slot, ids, str(slot)))
        worker.generate(step, len(prompts))
        mine = out.take(0, inp.expected(rank, len(prompts)))
        groups.update({g.slot: g for g in mine})
    return groups, out


def test_continuous_batching_draws_per_prompt_whatever_the_ranks_and_batch_size(tiny_ckpt):
    def ids(groups):
        return {slot: g.batch.response_ids.tolist() for slot, g in groups.items()}

    one, _ = _continuous(tiny_ckpt, step=2, max_running=256)
    assert ids(one) == ids(_continuous(tiny_ckpt, step=2, max_running=3)[0])  # one prompt at a time
    assert ids(one) == ids(_continuous(tiny_ckpt, step=2, ranks=2)[0])  # slots split over two ranks
    assert ids(one) != ids(_continuous(tiny_ckpt, step=3)[0])  # another iteration, other draws
    assert sorted(one) == list(range(len(PROMPTS)))


def test_continuous_batching_sends_groups_before_generation_ends(tiny_ckpt):
    import time

    prompts = [PROMPTS[k % 4] for k in range(200)]
    cfg = RolloutConfig(backend="lean", sampling=SamplingConfig(n=2, max_new_tokens=5), max_running=8)
    inp, out = MemoryStream(), _TimedStream()
    worker = local_worker(RolloutWorker, settings=rollout_settings(tiny_ckpt, cfg, inp, out, seed=0))
    for slot, ids in enumerate(prompts):
        inp.put(PromptTask(0, slot, slot, ids, None))
    metrics = worker.generate(0, len(prompts))
    end = time.perf_counter()
    groups = out.take(0, len(prompts))
    assert sorted(g.slot for g in groups) == list(range(200))  # nothing lost, nothing twice
    assert not out.queues[0]
    first_put, _ = out.put_times[0]
    last_put, _ = out.put_times[-1]
    # The first groups left while most of the batch was still to generate (at most 4 prompts run at once).
    assert len(out.put_times) == metrics["rollout/emits_count"] > 50
    assert first_put < last_put < end and len(out.put_times[0][1]) <= 4
    assert metrics["rollout/responses_count"] == 400


def test_chunked_batching_stays_selectable_and_is_the_old_path(tiny_ckpt):
    hf, _ = _generate(tiny_ckpt, step=2, seed=1, chunk=3)
    cfg = RolloutConfig(backend="lean", batching="chunked", sampling=SamplingConfig(n=3, max_new_tokens=5),
                        prompts_per_chunk=3)
    prompts, out = MemoryStream(), MemoryStream()
    worker = local_worker(RolloutWorker, settings=rollout_settings(tiny_ckpt, cfg, prompts, out, seed=1))
    assert worker.generation.batching == "chunked"
    for slot, ids in enumerate(PROMPTS):
        prompts.put(PromptTask(2, slot, 100 + slot, ids, str(slot)))
    worker.generate(2, len(PROMPTS))
    lean = out.take(0, len(PROMPTS))
    assert [g.batch.response_ids.tolist() for g in lean] == [g.batch.response_ids.tolist() for g in hf]
