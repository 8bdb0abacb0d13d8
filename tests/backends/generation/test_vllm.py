"""vLLM backend on a CUDA machine with vllm installed; skipped elsewhere."""

from __future__ import annotations

import pytest

from m2flow.backends.generation import SamplingParams
from m2flow.backends.generation.vllm import VLLMGenerationBackend, vllm_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not vllm_available(), reason="needs vllm and CUDA"),
]


def test_groups_stop_strings_and_lengths(ckpt, tok):
    backend = VLLMGenerationBackend.from_pretrained(ckpt, gpu_memory_utilization=0.2, enforce_eager=True)
    prompts = [tok(t)["input_ids"] for t in ("12+7=", "3+4=", "5*5=")]
    groups = list(backend.generate_iter(prompts, SamplingParams(n=4, max_new_tokens=6, seed=0), prompts_per_chunk=2))
    assert [g.prompt_index for g in groups] == [0, 1, 2]
    for g in groups:
        assert len(g.responses) == 4
        for r in g.responses:
            assert len(r.token_ids) == len(r.logprobs) <= 6
            assert r.finish_reason in ("stop", "length")
    params = SamplingParams(n=4, max_new_tokens=6, seed=0)
    first, second = backend.generate(prompts, params), backend.generate(prompts, params)
    assert [r.token_ids for g in first for r in g.responses] == [r.token_ids for g in second for r in g.responses]
    stopped = backend.generate(prompts, SamplingParams(n=4, max_new_tokens=6, seed=0, stop=("1",)))
    assert all("1" not in r.text for g in stopped for r in g.responses)
    backend.offload()
    backend.onload()
    assert backend.generate(prompts[:1], SamplingParams(max_new_tokens=2))[0].responses


def test_weights_loaded_while_asleep_are_generated_from_after_waking(ckpt, tok, taught):
    """The collocated order: sleep after the last chunk, the next weight sync, wake for the first chunk."""
    backend = VLLMGenerationBackend.from_pretrained(ckpt, gpu_memory_utilization=0.2, enforce_eager=True)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=3)
    prompt = [tok("12+7=")["input_ids"]]
    backend.offload()
    backend.load_weights({k: v.detach().cuda() for k, v in taught.state_dict().items()})
    backend.onload()
    assert backend.generate(prompt, greedy)[0].responses[0].text.startswith("19")
