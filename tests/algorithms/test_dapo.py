"""DAPO dynamic sampling and overlong shaping."""

from __future__ import annotations

import pytest
import torch

from m2flow.algorithms.dapo import dynamic_sampling_filter, overlong_penalty


def test_filter_by_hand():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    # groups of 2: (1,1) constant, (0,1) kept, (0,0) constant, (1,1) constant
    out = dynamic_sampling_filter(scores, group_size=2)
    assert out.kept_indices.tolist() == [2, 3]
    assert (out.num_groups, out.num_groups_dropped) == (4, 3)
    # Ids need not be contiguous. Group 5 = samples 0, 2 = (1, 0): kept; group 9 = samples 1, 3 =
    # (1, 1), group 1 = (0, 0), group 2 = (1, 1): dropped. Kept indices stay in batch order.
    out = dynamic_sampling_filter(scores, group_index=torch.tensor([5, 9, 5, 9, 1, 1, 2, 2]))
    assert out.kept_indices.tolist() == [0, 2]
    assert (out.num_groups, out.num_groups_dropped) == (4, 3)


@pytest.mark.parametrize("seed", range(10))
def test_filter_matches_loop(seed: int):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 2, (12,), generator=gen).float()
    ids = torch.randint(0, 5, (12,), generator=gen)
    out = dynamic_sampling_filter(scores, group_index=ids)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(ids.tolist()):
        members.setdefault(g, []).append(i)
    keep = sorted(i for idx in members.values() if len({scores[i].item() for i in idx}) > 1 for i in idx)
    dropped = sum(len({scores[i].item() for i in idx}) == 1 for idx in members.values())
    assert out.kept_indices.tolist() == keep
    assert (out.num_groups, out.num_groups_dropped) == (len(members), dropped)


def test_filter_tolerance():
    out = dynamic_sampling_filter(torch.tensor([0.5, 0.5001, 0.0, 1.0]), group_size=2, atol=1e-3)
    assert out.kept_indices.tolist() == [2, 3] and out.num_groups_dropped == 1


def test_overlong_penalty_by_hand():
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    # max 20, buffer 4: free up to 16, then -(len - 16) / 4, and -1 from 20 on
    torch.testing.assert_close(
        overlong_penalty(lengths, max_length=20, buffer_length=4),
        torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]),
    )
    torch.testing.assert_close(
        overlong_penalty(lengths, max_length=20, buffer_length=4, penalty=0.5),
        torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5]),
    )
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(lengths, max_length=20, buffer_length=0)
