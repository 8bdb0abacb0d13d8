from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from m2flow.algorithms.losses import policy_loss
from m2flow.algorithms.minibatch_ppo import ppo_minibatch_loss
from m2flow.envs.instructions import INSTRUCTIONS, PAD_ID, WordTokenizer
from m2flow.models.action_tokens import ActionBins
from m2flow.models.policies import Policy, build_policy
from m2flow.models.vla import VLAConfig, VLAPolicy, build_vla

ACTIONS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


def packed_obs(config: VLAConfig, n: int, seed: int = 0) -> torch.Tensor:
    """n packed observations: random images, the instruction table's sentences, random proprio."""
    rng = np.random.default_rng(seed)
    lay, tok = config.layout(), WordTokenizer.versioned()
    texts = list(INSTRUCTIONS.values())
    rows = [lay.pack(rng.integers(0, 256, (lay.height, lay.width, 3), dtype=np.uint8),
                     tok.encode(texts[i % len(texts)], lay.text_len),
                     rng.normal(size=lay.proprio_dim).astype(np.float32)) for i in range(n)]
    return torch.from_numpy(np.stack(rows))


def small() -> VLAConfig:
    return VLAConfig(height=32, width=32, dim=32, depth=1, heads=2, stem_channels=[8, 16], grid=2, num_bins=16)


def test_action_bins_round_trip():
    bins = ActionBins(256)
    tokens = torch.arange(256).repeat(4, 1).T  # [256, 4]
    assert torch.equal(bins.to_tokens(bins.to_actions(tokens)), tokens)
    a = torch.empty(1000, 4).uniform_(-1.5, 1.5)
    back = bins.to_actions(bins.to_tokens(a))
    assert (back - a.clamp(-1, 1)).abs().max() <= bins.width / 2 + 1e-6
    assert bins.to_tokens(torch.tensor([-1.0, 1.0])).tolist() == [0, 255]
    with pytest.raises(ValueError, match="num_bins"):
        ActionBins(1)


def test_default_size_shapes_and_interface():
    config = VLAConfig()
    space = gym.spaces.Box(0, 255, (config.layout().size,), np.uint8)
    policy = build_vla(space, ACTIONS, config)
    params = sum(p.numel() for p in policy.parameters())
    assert 0.5e6 <= params <= 5e6, params
    assert isinstance(policy, Policy) and isinstance(build_policy(gym.spaces.Box(-1, 1, (3,)), ACTIONS), Policy)
    obs = packed_obs(config, 3)
    logits, values = policy(obs)
    assert logits.shape == (3, 4, 256) and values.shape == (3,)
    out = policy.act(obs)
    assert out.actions.shape == (3, 4) and out.logprobs.shape == (3, 4) and out.values.shape == (3,)
    assert out.actions.abs().max() < 1.0
    ev = policy.evaluate(obs, out.actions)
    assert torch.allclose(ev.logprobs, out.logprobs, atol=1e-5)  # the centres map back to the sampled tokens
    assert torch.allclose(ev.values, out.values, atol=1e-5) and (ev.entropy > 0).all() and ev.entropy.shape == (3,)
    # logprob: action sums the four token log-probs into the action's one
    joint = VLAPolicy(VLAConfig(logprob="action"), 4)
    joint.load_state_dict(policy.state_dict())
    assert torch.allclose(joint.evaluate(obs, out.actions).logprobs, ev.logprobs.sum(-1), atol=1e-5)


def test_act_samples_from_the_generator_it_is_given():
    torch.manual_seed(0)
    policy = VLAPolicy(small(), 4)
    obs = packed_obs(small(), 5)
    a = policy.act(obs, generator=torch.Generator().manual_seed(3)).actions
    b = policy.act(obs, generator=torch.Generator().manual_seed(3)).actions
    c = policy.act(obs, generator=torch.Generator().manual_seed(4)).actions
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sampled_token_log_probs_match_the_distribution():
    torch.manual_seed(0)
    config = small()
    policy = VLAPolicy(config, 4)
    obs = packed_obs(config, 1).expand(2000, -1)
    tokens, logprobs, _ = policy.act_tokens(obs)
    logits, _ = policy(obs[:1])
    probs = torch.softmax(logits[0], -1)  # [A, bins]
    for d in range(4):
        freq = torch.bincount(tokens[:, d], minlength=config.num_bins).float() / len(tokens)
        assert (freq - probs[d]).abs().max() < 0.05
    assert torch.allclose(logprobs, probs.log().gather(-1, tokens.T).T, atol=1e-5)
    # Deterministic acting takes every dimension's most likely bin.
    assert torch.equal(policy.act_tokens(obs[:1], deterministic=True)[0][0], probs.argmax(-1))


def test_instruction_changes_the_output_and_padding_does_not_leak():
    torch.manual_seed(0)
    config = small()
    policy = VLAPolicy(config, 4)
    obs = packed_obs(config, 2)
    lay = config.layout()
    obs[1, : lay.image_bytes] = obs[0, : lay.image_bytes]
    obs[1, lay.image_bytes + lay.text_len :] = obs[0, lay.image_bytes + lay.text_len :]
    logits, _ = policy(obs)
    assert not torch.allclose(logits[0], logits[1])  # same image and proprio, another instruction


def test_a_row_gives_the_same_outputs_whatever_padding_its_batch_keeps():
    torch.manual_seed(0)
    config = small()
    policy = VLAPolicy(config, 4)
    obs = packed_obs(config, 6)
    lay = config.layout()
    lengths = [int((row[lay.image_bytes : lay.image_bytes + lay.text_len] != PAD_ID).sum()) for row in obs]
    short = int(np.argmin(lengths))
    assert lengths[short] < max(lengths) < lay.text_len  # the batch is cut to its longest instruction, the row to its own
    logits, values = policy(obs)
    alone_logits, alone_values = policy(obs[short : short + 1])
    torch.testing.assert_close(alone_logits[0], logits[short], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone_values[0], values[short], atol=1e-5, rtol=1e-5)


def test_token_log_probs_feed_the_registered_losses():
    torch.manual_seed(0)
    config = small()
    policy = VLAPolicy(config, 4)
    obs = packed_obs(config, 8)
    tokens, old, values = policy.act_tokens(obs)
    adv = torch.randn(8)
    out = policy.token_outputs(obs, tokens)
    assert torch.allclose(out.logprobs, old, atol=1e-5)
    token_loss = policy_loss("ppo", out.logprobs, old, adv[:, None].expand(-1, 4), torch.ones(8, 4))
    joint = policy.evaluate(obs, policy.bins.to_actions(tokens))
    loss, _ = ppo_minibatch_loss(joint.logprobs.sum(-1) - old.sum(-1), -adv / 8, joint.values, values + adv,
                                 clip=0.2, scale=1 / 8, ent_coef=0.01, entropy_sum=joint.entropy.sum())
    (token_loss.loss + loss).backward()
    assert policy.action_head.weight.grad.abs().sum() > 0 and policy.value_head.weight.grad.abs().sum() > 0


def test_mismatched_spaces_fail_naming_the_layout():
    with pytest.raises(ValueError, match="packed uint8"):
        build_vla(gym.spaces.Box(0, 255, (10,), np.uint8), ACTIONS)
    with pytest.raises(ValueError, match="action_low"):
        build_vla(gym.spaces.Box(0, 255, (VLAConfig().layout().size,), np.uint8), gym.spaces.Box(-2, 2, (4,)))
    with pytest.raises(ValueError, match="dim"):
        VLAConfig(dim=30, heads=4).validate()


def test_a_policy_of_the_older_vocabulary_loads_and_reads_mt10_the_same(tmp_path):
    from dataclasses import replace

    from m2flow.envs.instructions import MT10, VOCABULARIES
    from m2flow.models.init_weights import load_policy_weights
    from m2flow.models.vla import save_policy

    torch.manual_seed(0)
    old = VLAPolicy(replace(small(), vocab_size=len(VOCABULARIES[1]) + 2), 4).eval()  # trained before version 2
    path = save_policy(old, tmp_path / "old.pt")
    new = VLAPolicy(small(), 4).eval()
    assert new.word.num_embeddings > old.word.num_embeddings
    load_policy_weights(new, path)
    lay, tok = small().layout(), WordTokenizer.versioned()
    obs = torch.from_numpy(np.stack([lay.pack(np.zeros((32, 32, 3), np.uint8), tok.encode(INSTRUCTIONS[t], lay.text_len),
                                              np.zeros(4, np.float32)) for t in MT10]))
    with torch.no_grad():
        assert torch.equal(old(obs)[0], new(obs)[0])
    fresh = VLAPolicy(small(), 4)
    fresh.load_state_dict(old.state_dict())  # a run's checkpoint (load_state_dict) pads the same way
    assert torch.equal(fresh.word.weight[: old.word.num_embeddings], old.word.weight)


@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_the_query_rows_of_the_last_layer_equal_the_whole_encoder(decoding):
    """``_encode`` computes the last layer for the query rows only: the same outputs as the whole encoder."""
    torch.manual_seed(0)
    config = VLAConfig(height=32, width=32, dim=32, depth=3, heads=2, stem_channels=[8, 16], grid=2, num_bins=16,
                       decoding=decoding, chunk=2)
    policy = VLAPolicy(config, 4)
    q, b, length = policy.queries.shape[1], 5, 14
    x = torch.randn(b, length, config.dim)
    key_pad = torch.zeros(b, length, dtype=torch.bool)
    key_pad[1:3, 6:8] = True  # a prompt with padding in two rows
    mask = policy._causal_mask(length - q, x.device) if decoding == "autoregressive" else None
    whole = policy.encoder(x, mask=mask, src_key_padding_mask=key_pad)[:, -q:]
    rows = policy._encode(x, mask, key_pad)
    torch.testing.assert_close(rows, whole, atol=1e-5, rtol=1e-5)
    # ... and the same gradients: the rows it skips reach no output
    weights = torch.randn_like(whole)
    grads = [torch.autograd.grad((out * weights).sum(), list(policy.encoder.parameters())) for out in (whole, rows)]
    for g_whole, g_rows in zip(*grads):
        torch.testing.assert_close(g_rows, g_whole, atol=1e-5, rtol=1e-4)
    no_pad = policy.encoder(x, mask=mask)[:, -q:]
    torch.testing.assert_close(policy._encode(x, mask, None), no_pad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grid", [0, 9])
def test_a_grid_the_stem_cannot_give_names_the_field(grid):
    with pytest.raises(ValueError, match=r"grid: must be in \[1, 8\] for 64x64 images"):
        VLAConfig(grid=grid).validate()


def test_proprioception_is_read_standardised_so_its_units_do_not_matter():
    # The same weights read x with statistics (m, s) as they read 100 x + 3 with (100 m + 3, 100 s).
    torch.manual_seed(0)
    a, b = VLAPolicy(small(), 4), VLAPolicy(small(), 4)
    b.load_state_dict(a.state_dict())
    obs = packed_obs(small(), 6, seed=2)
    lay = small().layout()
    images, ids, proprio = (np.asarray(x) for x in lay.unpack(obs.numpy()))
    scaled = torch.from_numpy(np.stack([lay.pack(i, t, 100.0 * p + 3.0) for i, t, p in zip(images, ids, proprio)]))
    a.set_proprio_stats(torch.from_numpy(proprio))
    b.set_proprio_stats(torch.from_numpy(100.0 * proprio + 3.0))
    with torch.no_grad():
        for x, y in zip(a(obs), b(scaled)):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(a(obs)[0], VLAPolicy(small(), 4).eval()(obs)[0])  # not the identity any more


def test_proprio_statistics_are_saved_and_an_older_policy_loads_unscaled(tmp_path):
    from m2flow.models.vla import save_policy

    torch.manual_seed(0)
    policy = VLAPolicy(small(), 4)
    values = torch.tensor([[0.4, 0.6, 0.2, 1.0], [0.5, 0.7, 0.2, 1.0], [0.6, 0.5, 0.2, 1.0]])
    policy.set_proprio_stats(values)
    torch.testing.assert_close(policy.proprio_mean, values.mean(0))
    assert policy.proprio_std[2] == 1.0 and policy.proprio_std[3] == 1.0  # constant dimensions: centred only
    loaded = torch.load(save_policy(policy, tmp_path / "p.pt"), weights_only=True)["policy"]
    torch.testing.assert_close(loaded["proprio_std"], policy.proprio_std)
    older = {k: v for k, v in loaded.items() if not k.startswith("proprio_mean") and not k.startswith("proprio_std")}
    fresh = VLAPolicy(small(), 4)
    fresh.load_state_dict(older)  # a file from before the statistics existed
    assert torch.equal(fresh.proprio_mean, torch.zeros(4)) and torch.equal(fresh.proprio_std, torch.ones(4))
    with pytest.raises(ValueError, match=r"proprio stats need \(N >= 2, 4\) values"):
        policy.set_proprio_stats(torch.zeros(5, 3))
