from __future__ import annotations

import numpy as np
import pytest
import torch

from m2flow.models.bc import BCConfig, behaviour_clone, random_shift
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
