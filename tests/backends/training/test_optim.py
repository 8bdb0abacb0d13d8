"""Optimizer construction and the learning-rate schedule, checked against hand-computed factors."""

from __future__ import annotations

import math

import pytest
import torch

from m2flow.backends.training import OptimConfig, build_optimizer, build_scheduler, lr_factor


def test_warmup_then_constant():
    f = [lr_factor(s, schedule="constant", warmup_steps=4, total_steps=10, min_lr_ratio=0.0) for s in range(6)]
    assert f == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_and_cosine_decay_reach_the_floor_at_total_steps():
    lin = [lr_factor(s, schedule="linear", warmup_steps=0, total_steps=4, min_lr_ratio=0.2) for s in range(6)]
    assert lin == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2])
    cos = [lr_factor(s, schedule="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.0) for s in range(2, 7)]
    assert cos == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0])


def test_scheduler_follows_the_factor_once_per_step():
    p = torch.nn.Parameter(torch.zeros(2))
    cfg = OptimConfig(lr=0.1, schedule="linear", warmup_steps=1, min_lr_ratio=0.0)
    opt = build_optimizer([p], cfg)
    sched = build_scheduler(opt, cfg, total_steps=3)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.1, 0.1, 0.05])


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)])
def test_optimizers_by_name_over_trainable_parameters_only(name, cls):
    frozen = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
    live = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([frozen, live], OptimConfig(name=name, lr=0.5))
    assert isinstance(opt, cls) and opt.param_groups[0]["params"] == [live]


def test_no_trainable_parameters_and_bad_values_fail():
    with pytest.raises(ValueError, match="no trainable"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1), requires_grad=False)], OptimConfig())
    with pytest.raises(ValueError, match="lr"):
        OptimConfig(lr=0).validate()
    with pytest.raises(ValueError, match="min_lr_ratio"):
        OptimConfig(min_lr_ratio=2).validate()


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_fused_kernel_is_the_default_on_cpu_and_steps_like_the_per_tensor_loop(name):
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    b = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    b.load_state_dict(a.state_dict())
    cfg = dict(name=name, lr=1e-2, weight_decay=0.01, momentum=0.9)
    fused = build_optimizer(a.parameters(), OptimConfig(**cfg))
    loop = build_optimizer(b.parameters(), OptimConfig(**cfg, fused=False))
    assert fused.defaults["fused"] is True and not loop.defaults["fused"]
    x = torch.randn(32, 8)
    for _ in range(5):
        for model, opt in ((a, fused), (b, loop)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert not torch.equal(pa, torch.zeros_like(pa))
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_fused_is_refused_for_parameters_it_cannot_take():
    doubles = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    assert build_optimizer([doubles], OptimConfig()).defaults["fused"] is True  # float64 is fine
    meta = torch.nn.Parameter(torch.zeros(3, device="meta"))
    assert not build_optimizer([meta], OptimConfig()).defaults["fused"]
    with pytest.raises(ValueError, match="optim.fused=true needs plain floating-point parameters"):
        build_optimizer([meta], OptimConfig(fused=True))


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_a_fused_step_marks_the_parameters_changed(name):
    """A generator over the trained model (a fused rollout's FunctionalLM) rebuilds its weights when their
    version counters move; torch's fused kernels do not move them, so the optimizer must."""
    from m2flow.models.functional_lm import FunctionalLM
    from m2flow.models.tiny import TinyModelConfig, build_tiny_model
    from m2flow.models.tokenizer import train_tokenizer

    model = build_tiny_model(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                             intermediate_size=32), train_tokenizer(["0123456789"]))
    decoder = FunctionalLM.from_hf(model)
    opt = build_optimizer(model.parameters(), OptimConfig(name=name, lr=0.1, fused=True))
    assert not decoder.stale
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    assert decoder.stale
