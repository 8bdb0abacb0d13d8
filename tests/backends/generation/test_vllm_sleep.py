"""The vLLM backend's sleep and wake order, against an engine that sleeps as vLLM's level 1 does.

``SleepingEngine`` models what matters of ``vllm.LLM`` with sleep mode: ``sleep(level=1)`` copies the
weights to host memory and releases the device memory behind weights and KV cache; a write into
weights that have no device memory is lost; ``wake_up(tags)`` maps the tagged memory again, copying
the host copy back over the weights. Generation needs both awake, and answers with a token that
tells which weights it ran on.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from m2flow.backends.generation import SamplingParams, VLLMGenerationBackend


class SleepingEngine:
    def __init__(self, weight: float) -> None:
        self.weights = {"w": torch.tensor([weight])}
        self.host_copy: dict[str, torch.Tensor] | None = None
        self.mapped = {"weights": True, "kv_cache": True}
        self.calls: list[str] = []

    def sleep(self, level: int = 1) -> None:
        assert level == 1 and all(self.mapped.values()), "vLLM sleeps from awake"
        self.host_copy = {k: v.clone() for k, v in self.weights.items()}
        self.mapped = {"weights": False, "kv_cache": False}
        self.calls.append("sleep")

    def wake_up(self, tags: list[str] | None = None) -> None:
        for tag in tags or ["weights", "kv_cache"]:
            if tag == "weights" and not self.mapped["weights"]:
                assert self.host_copy is not None
                self.weights = {k: v.clone() for k, v in self.host_copy.items()}  # the copy taken at sleep
            self.mapped[tag] = True
        self.calls.append(f"wake_up({','.join(tags or ['all'])})")

    def apply_model(self, fn):
        engine = self

        class Model:
            def load_weights(self, items):
                if not engine.mapped["weights"]:
                    return  # no device memory behind the weights: the write goes nowhere
                for name, tensor in items:
                    engine.weights[name].copy_(tensor)

        return [fn(Model())]

    def generate(self, prompts, sampling_params, use_tqdm=False):
        if not all(self.mapped.values()):
            raise RuntimeError("generate on a sleeping engine")
        token = int(self.weights["w"].item())
        step = {token: SimpleNamespace(logprob=-0.5)}
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[token], logprobs=[step], finish_reason="stop",
                                                         text=str(token))]) for _ in prompts]

    def get_tokenizer(self):
        return SimpleNamespace(pad_token_id=0, eos_token_id=0)


@pytest.fixture
def backend(monkeypatch):
    # vllm.SamplingParams is not importable here; the fake engine ignores the parameters anyway.
    monkeypatch.setattr(VLLMGenerationBackend, "_sampling_params", staticmethod(lambda params, chunk: params))
    return VLLMGenerationBackend(SleepingEngine(3.0))


def _token(backend: VLLMGenerationBackend) -> int:
    return backend.generate([[1, 2]], SamplingParams(max_new_tokens=1))[0].responses[0].token_ids[0]


def test_weights_loaded_while_the_engine_sleeps_are_the_ones_generated_from(backend):
    assert _token(backend) == 3
    backend.offload()                                  # the rollout's last chunk of an iteration
    backend.load_weights({"w": torch.tensor([5.0])})   # the next iteration's weight sync
    assert backend.llm.mapped == {"weights": True, "kv_cache": False}  # KV cache still released
    backend.onload()                                   # the first chunk's device turn
    assert _token(backend) == 5
    assert backend.llm.calls == ["sleep", "wake_up(weights)", "wake_up(kv_cache)"]


def test_the_order_without_a_weight_load_and_twice_over(backend):
    backend.offload()
    with pytest.raises(RuntimeError, match="offloaded .*call onload"):
        _token(backend)
    backend.onload()
    assert _token(backend) == 3 and backend.llm.calls == ["sleep", "wake_up(all)"]
    for weight in (7.0, 9.0):
        backend.offload()
        backend.load_weights({"w": torch.tensor([weight])})
        backend.load_weights({"w": torch.tensor([weight])})  # a second load finds the weights awake
        backend.onload()
        assert _token(backend) == int(weight)
    backend.offload()
    backend.load_weights({"w": torch.tensor([11.0])})
    backend.offload()  # asleep again before any generation: the new weights are what sleeps
    backend.onload()
    assert _token(backend) == 11


def test_an_engine_without_wake_up_tags_wakes_whole(backend):
    engine = backend.llm
    plain = engine.wake_up
    engine.wake_up = lambda: plain()  # an older vLLM: wake_up() takes no tags
    backend.offload()
    backend.load_weights({"w": torch.tensor([4.0])})
    backend.onload()
    assert _token(backend) == 4
