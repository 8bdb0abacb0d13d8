from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from m2flow.models.policies import (
    ActorCritic,
    PolicyConfig,
    build_policy,
    pick_encoder,
    register_encoder,
)

torch.set_num_threads(1)

VEC_OBS = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
BOX_ACT = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
SMALL_CNN = dict(cnn_channels=[4, 8], cnn_kernels=[3, 3], cnn_strides=[2, 1], cnn_features=16)


def test_gaussian_logprob_entropy_match_torch_distributions():
    torch.manual_seed(0)
    policy = build_policy(VEC_OBS, BOX_ACT, PolicyConfig(log_std_init=-0.3))
    with torch.no_grad():
        policy.head.log_std.copy_(torch.tensor([-0.5, 0.0, 0.7]))
    obs = torch.randn(6, 5)
    actions = torch.randn(6, 3)
    out = policy.evaluate(obs, actions)
    mean = policy.head.mean(policy.actor_trunk(obs))
    std = torch.tensor([-0.5, 0.0, 0.7]).exp()
    reference = torch.distributions.Normal(mean, std)
    torch.testing.assert_close(out.logprobs, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(out.entropy, reference.entropy().sum(-1))
    # By hand for one row: sum_i -((a-m)/s)^2/2 - log s - log(2 pi)/2.
    a, m = actions[0], mean[0].detach()
    by_hand = sum(
        -0.5 * ((a[i] - m[i]) / std[i]) ** 2 - math.log(std[i]) - 0.5 * math.log(2 * math.pi)
        for i in range(3)
    )
    assert out.logprobs[0].item() == pytest.approx(float(by_hand), rel=1e-5)
    torch.testing.assert_close(out.values, policy.value(obs))


def test_gaussian_act_logprob_consistent_and_deterministic_is_mean():
    torch.manual_seed(1)
    policy = build_policy(VEC_OBS, BOX_ACT)
    obs = torch.randn(4, 5)
    actions, logprobs, values = policy.act(obs)
    assert actions.shape == (4, 3) and logprobs.shape == (4,) and values.shape == (4,)
    assert not logprobs.requires_grad
    torch.testing.assert_close(policy.evaluate(obs, actions).logprobs, logprobs)
    det = policy.act(obs, deterministic=True).actions
    torch.testing.assert_close(det, policy.distribution(obs).mean)


def test_categorical_logprob_entropy_match_torch_distributions():
    torch.manual_seed(2)
    policy = build_policy(VEC_OBS, gym.spaces.Discrete(4))
    obs = torch.randn(7, 5)
    actions, logprobs, values = policy.act(obs)
    assert actions.shape == (7,) and actions.dtype == torch.int64
    logits = policy.head.logits(policy.actor_trunk(obs))
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logprobs, reference.log_prob(actions))
    out = policy.evaluate(obs, actions)
    torch.testing.assert_close(out.logprobs, reference.log_prob(actions))
    torch.testing.assert_close(out.entropy, reference.entropy())
    p = torch.softmax(logits[0], -1)
    assert out.entropy[0].item() == pytest.approx(-(p * p.log()).sum().item(), rel=1e-5)
    assert (policy.act(obs, deterministic=True).actions == logits.argmax(-1)).all()


@pytest.mark.parametrize("shape", [(16, 16, 3), (3, 16, 16)])
def test_pixel_observations_shapes(shape):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    cfg = PolicyConfig(hidden_sizes=[32], **SMALL_CNN)
    assert pick_encoder(space, cfg) == "cnn"
    policy = build_policy(space, gym.spaces.Discrete(3), cfg)
    obs = torch.randint(0, 256, (2, *shape), dtype=torch.uint8)
    actions, logprobs, values = policy.act(obs)
    assert actions.shape == (2,) and logprobs.shape == (2,) and values.shape == (2,)
    out = policy.evaluate(obs, actions)
    out.logprobs.sum().backward()
    assert policy.actor_trunk[0].convs[0].weight.grad is not None


def test_cnn_with_no_mlp_layers_is_sb3_cnn_policy_shaped():
    # NatureCNN (32-64-64 convolutions, 512 ReLU features) shared by both heads: SB3's CnnPolicy has 603,305
    # parameters on (64, 64, 3) images with 4 continuous actions.
    pixels = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    cfg = PolicyConfig(encoder="cnn", shared_critic=True, hidden_sizes=[], activation="relu")
    policy = build_policy(pixels, gym.spaces.Box(-1.0, 1.0, (4,), np.float32), cfg)
    assert sum(p.numel() for p in policy.parameters()) == 603_305
    assert policy.critic_trunk is None and policy.actor_trunk.out_dim == 512
    out = policy.act(torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8))
    assert out.actions.shape == (2, 4) and out.values.shape == (2,)


def test_shared_vs_separate_critic():
    shared = build_policy(VEC_OBS, BOX_ACT, PolicyConfig(shared_critic=True))
    separate = build_policy(VEC_OBS, BOX_ACT, PolicyConfig(shared_critic=False))
    assert shared.critic_trunk is None and separate.critic_trunk is not None
    n_shared = sum(p.numel() for p in shared.parameters())
    n_separate = sum(p.numel() for p in separate.parameters())
    # Separate adds one 5-64-64 trunk: (5*64+64) + (64*64+64) parameters.
    assert n_separate - n_shared == (5 * 64 + 64) + (64 * 64 + 64)
    # Value gradients reach the actor trunk only when it is shared.
    shared.value(torch.randn(3, 5)).sum().backward()
    assert shared.actor_trunk.net[1].weight.grad is not None
    separate.value(torch.randn(3, 5)).sum().backward()
    assert separate.actor_trunk.net[1].weight.grad is None


def test_default_matches_sb3_mlp_policy_layout_and_init():
    policy = build_policy(VEC_OBS, BOX_ACT)
    assert isinstance(policy, ActorCritic)
    linears = [m for m in policy.actor_trunk.modules() if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(64, 5), (64, 64)]
    assert isinstance(policy.actor_trunk.net[2], torch.nn.Tanh)
    assert torch.all(policy.head.log_std == 0.0)
    assert all(torch.all(m.bias == 0) for m in linears)
    # Orthogonal with gain g: rows (or columns) have norm g.
    w = policy.head.mean.weight
    torch.testing.assert_close(w @ w.T, 0.01**2 * torch.eye(3), atol=1e-6, rtol=0)
    v = policy.value_head.weight
    assert v.norm().item() == pytest.approx(1.0, rel=1e-5)


def test_bad_config_and_spaces_fail_listing_choices():
    with pytest.raises(ValueError, match=r"activation: unknown 'swish'.*tanh"):
        build_policy(VEC_OBS, BOX_ACT, PolicyConfig(activation="swish"))
    with pytest.raises(ValueError, match=r"encoder: unknown 'rnn'.*cnn"):
        build_policy(VEC_OBS, BOX_ACT, PolicyConfig(encoder="rnn"))
    with pytest.raises(ValueError, match="supported: Box"):
        build_policy(VEC_OBS, gym.spaces.MultiBinary(3))
    with pytest.raises(ValueError, match="already registered"):
        register_encoder("mlp")(lambda space, cfg: None)


def test_config_documented_and_loaded_from_plain_data():
    from m2flow.config import ConfigError, from_dict, undocumented

    assert undocumented(PolicyConfig) == []
    cfg = from_dict(PolicyConfig, {"hidden_sizes": [32, 32], "activation": "relu"})
    assert build_policy(VEC_OBS, BOX_ACT, cfg).actor_trunk.net[1].out_features == 32
    with pytest.raises(ConfigError, match="hidden_sizes"):
        from_dict(PolicyConfig, {"hidden_sizes": [0]})


def test_cnn_too_large_for_the_image_fails_naming_the_fields():
    tiny = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
    with pytest.raises(ValueError, match="cnn_kernels"):
        build_policy(tiny, gym.spaces.Discrete(2))  # Nature-CNN defaults need at least 36 x 36
