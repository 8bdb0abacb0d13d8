from __future__ import annotations

import numpy as np
import pytest
import torch

from m2flow.models.bc import BCConfig, behaviour_clone, chunk_targets, random_shift
from m2flow.models.vla import VLAConfig, VLAPolicy
from tests.models.test_vla import packed_obs


@pytest.mark.learning
def test_a_tiny_behaviour_cloning_run_lowers_the_loss_and_reports_progress():
    torch.manual_seed(0)
    config = VLAConfig(height=32, width=32, dim=32, depth=1, heads=2, stem_channels=[8, 16], grid=2, num_bins=16)
    policy = VLAPolicy(config, 4)
    obs = packed_obs(config, 64).numpy()
    # The expert's action depends on the instruction: the task index spread over the action range.
    lay = config.layout()
    ids = lay.unpack(obs)[1]
    task = np.unique(ids, axis=0, return_inverse=True)[1].reshape(-1)
    actions = np.repeat((task / task.max() * 1.8 - 0.9)[:, None], 4, axis=1).astype(np.float32)
    seen = []
    history = behaviour_clone(policy, obs, actions, BCConfig(epochs=20, batch_size=16, lr=3e-3, shift=2),
                              progress=seen.append)
    assert seen == history and [h.epoch for h in history] == list(range(1, 21))
    assert history[-1].loss < 0.5 * history[0].loss
    assert history[-1].token_accuracy > 0.9
    with pytest.raises(ValueError, match="equal length"):
        behaviour_clone(policy, obs, actions[:3])


def test_random_shift_moves_whole_images_within_the_pad():
    g = torch.Generator().manual_seed(0)
    images = torch.zeros(64, 8, 8, 3, dtype=torch.uint8)
    images[:, 3:5, 3:5] = 255
    out = random_shift(images, 2, g)
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert (out.float().sum((1, 2, 3)) == images[0].float().sum()).all()  # a 2x2 block moved, never cut
    assert len({tuple(o.nonzero()[0].tolist()) for o in out}) > 1


def test_chunk_targets_are_the_next_actions_of_the_same_episode_with_its_last_repeated():
    # Episodes 0 (3 steps), 1 (1 step), 0 again (2 steps: a new run of the same id is a new episode).
    actions = np.arange(6, dtype=np.float32)[:, None] * np.array([[1.0, -1.0]], dtype=np.float32)
    episode = np.array([0, 0, 0, 1, 0, 0])
    out = chunk_targets(actions, episode, 3)
    assert out.shape == (6, 3, 2)
    assert out[:, :, 0].tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 3, 3], [4, 5, 5], [5, 5, 5]]
    assert np.array_equal(out[:, :, 1], -out[:, :, 0])
    assert np.array_equal(chunk_targets(actions, episode, 1)[:, 0], actions)
    with pytest.raises(ValueError, match="episode must be"):
        chunk_targets(actions, episode[:3], 2)


@pytest.mark.learning
@pytest.mark.parametrize("decoding", ["parallel", "autoregressive"])
def test_cloning_a_chunked_policy_lowers_the_loss_of_all_its_tokens_as_ppo_scores_them(decoding):
    torch.manual_seed(0)
    config = VLAConfig(height=16, width=16, dim=16, depth=1, heads=2, stem_channels=[8], grid=2, num_bins=8,
                       chunk=4, decoding=decoding)
    policy = VLAPolicy(config, 4)
    # Two episodes of 16 steps, each one instruction and one expert action (a sign per episode).
    lay, episode = config.layout(), np.repeat([0, 1], 16)
    obs = packed_obs(config, 32).numpy()
    ids = slice(lay.image_bytes, lay.image_bytes + lay.text_len)
    obs[:, ids] = obs[episode, ids]
    actions = (np.where(episode == 0, 0.6, -0.6)[:, None] * np.array([1, -1, 0.5, -0.5])).astype(np.float32)
    targets = torch.as_tensor(chunk_targets(actions, episode, 4))  # [N, K, A]

    def nll() -> float:  # the actor's own scoring of the expert chunks: mean -log p per token
        with torch.no_grad():
            return float(-policy.evaluate(torch.as_tensor(obs), targets).logprobs.mean())

    before = nll()
    history = behaviour_clone(policy, obs, actions, BCConfig(epochs=15, batch_size=8, lr=1e-2, shift=0),
                              episode=episode)
    after = nll()
    assert history[-1].loss < 0.5 * history[0].loss
    assert after < 0.5 * before  # what BC lowered is what PPO's log-probs measure
    with pytest.raises(ValueError, match="needs each step's episode"):
        behaviour_clone(policy, obs, actions)


def _arm_frames(config: VLAConfig, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One scene and instruction; the arm's x (proprioception) within 6 cm, and the expert pushes left
    below 0.43 m and right above: only the proprioception tells the frames apart."""
    from m2flow.envs.instructions import WordTokenizer

    lay = config.layout()
    image = np.full((lay.height, lay.width, 3), 90, np.uint8)
    ids = WordTokenizer.versioned().encode("press the handle down", lay.text_len)
    proprio = np.zeros((n, 4), np.float32)
    proprio[:, 0], proprio[:, 1:3] = rng.uniform(0.40, 0.46, n), 0.6
    actions = np.zeros((n, 4), np.float32)
    actions[:, 0] = np.where(proprio[:, 0] > 0.43, 0.5, -0.5)
    return np.stack([lay.pack(image, ids, p) for p in proprio]), actions


@pytest.mark.learning
@pytest.mark.parametrize("seed", [0, 1])
def test_cloning_reads_a_few_centimetres_of_the_arm_once_proprioception_is_standardised(seed):
    # Unscaled, the 6 cm the arm moves barely change the proprio token, and cloning settles near one action
    # distribution for every frame (the loss stays near the marginal's, ln 2 / 4 a token); standardised by the
    # demonstrations' statistics, the policy acts on where the arm is.
    config = VLAConfig(height=32, width=32, dim=32, depth=1, heads=2, stem_channels=[8, 16], grid=2, num_bins=16)
    rng = np.random.default_rng(seed)
    obs, actions = _arm_frames(config, 128, rng)
    test_obs, test_actions = _arm_frames(config, 200, rng)
    results = {}
    for standardize in (True, False):
        torch.manual_seed(seed)
        policy = VLAPolicy(config, 4)
        history = behaviour_clone(policy, obs, actions, BCConfig(epochs=40, batch_size=32, lr=3e-3, shift=0, seed=seed,
                                                                 standardize_proprio=standardize))
        with torch.no_grad():
            greedy = policy.act(torch.from_numpy(test_obs), deterministic=True).actions.numpy()
        results[standardize] = (float((np.sign(greedy[:, 0]) == np.sign(test_actions[:, 0])).mean()), history[-1].loss)
    accuracy, loss = results[True]
    assert accuracy >= 0.95, results
    assert loss < 0.25 * results[False][1], results
    torch.testing.assert_close(policy.proprio_mean, torch.zeros(4))  # unscaled: identity statistics
