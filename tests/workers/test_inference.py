"""The inference worker: behaviour log-probs match the generator's, reference stays frozen, elastic batches."""

from __future__ import annotations

import torch

from m2flow.workers.config import AlgorithmConfig, InferenceConfig
from tests.workers.harness import Pipeline


def _run_to_inference(pipe: Pipeline, step: int = 0) -> list:
    from m2flow.workers.messages import PromptTask

    for slot, (ids, answer) in enumerate(zip(pipe.prompt_ids, pipe.answers)):
        pipe.streams[0].put(PromptTask(step, slot, slot, ids, answer))
    slots = len(pipe.prompt_ids)
    pipe.rollout.generate(step, slots)
    pipe.reward.score(step, slots)
    metrics = pipe.inference.compute(step, slots)
    return pipe.streams[3].take(0, slots), metrics


def test_recomputed_logprobs_match_the_generators_and_the_reference_starts_equal(tiny_ckpt):
    algo = AlgorithmConfig(kl_loss_coef=0.1)
    pipe = Pipeline(tiny_ckpt, algo, prompts=4, n=3, micro_batch_size=6)
    groups, metrics = _run_to_inference(pipe)
    assert [g.slot for g in groups] == [0, 1, 2, 3]
    for g in groups:
        b = g.batch
        assert b.old_logprobs.shape == b.response_ids.shape
        # Same weights: the full forward pass reproduces the log-probs sampled with the KV cache.
        assert torch.allclose(b.old_logprobs, b.rollout_logprobs, atol=1e-4)
        assert torch.allclose(b.ref_logprobs, b.old_logprobs, atol=1e-6)
    # micro_batch_size 6 with groups of 3: everything was ready, so two groups per forward pass.
    assert pipe.streams[2].taken == [2, 2]
    assert metrics["perf/inference_micro_batch"] == 6


def test_the_packed_forward_gives_the_hf_forwards_logprobs(tiny_ckpt):
    algo = AlgorithmConfig(kl_loss_coef=0.1)
    runs = {}
    for forward in ("hf", "packed"):
        pipe = Pipeline(tiny_ckpt, algo, prompts=4, n=3, micro_batch_size=6,
                        inference=InferenceConfig(micro_batch_size=6, forward=forward))
        runs[forward], _ = _run_to_inference(pipe)
    for hf, packed in zip(runs["hf"], runs["packed"], strict=True):
        assert torch.equal(hf.batch.response_ids, packed.batch.response_ids)  # the same samples
        torch.testing.assert_close(packed.batch.old_logprobs, hf.batch.old_logprobs, rtol=0, atol=1e-5)
        torch.testing.assert_close(packed.batch.ref_logprobs, hf.batch.ref_logprobs, rtol=0, atol=1e-5)


def test_nothing_is_computed_when_no_algorithm_needs_it(tiny_ckpt):
    pipe = Pipeline(tiny_ckpt, AlgorithmConfig(old_logprobs="rollout"))
    assert not pipe.inference.wants_weights()
    groups, metrics = _run_to_inference(pipe)
    assert all(g.batch.old_logprobs is None and g.batch.ref_logprobs is None for g in groups)
    assert metrics["time/inference"] == 0.0
