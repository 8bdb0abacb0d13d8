"""Response groups -> padded rollout batches; select, split, concatenate."""

from __future__ import annotations

import torch

from m2flow.data.batch import Response, ResponseGroup, RolloutBatch, left_pad, right_pad

PAD = 0


def _groups() -> list[ResponseGroup]:
    return [
        ResponseGroup(0, [5, 6, 7], [Response([8, 1], [-0.5, -0.1], "stop"), Response([9, 9, 9], [-1.0, -2.0, -3.0], "length")]),
        ResponseGroup(1, [4], [Response([3], [-0.2], "stop"), Response([2, 1], [-0.3, -0.4], "stop")]),
    ]


def test_pad_helpers():
    ids, mask = left_pad([[1, 2], [3]], PAD)
    assert ids.tolist() == [[1, 2], [0, 3]] and mask.tolist() == [[1, 1], [0, 1]]
    assert right_pad([[1.5], []], 0.0, dtype=torch.float32).tolist() == [[1.5], [0.0]]


def test_from_groups_layout():
    b = RolloutBatch.from_groups(_groups(), PAD)
    assert len(b) == 4
    assert b.prompt_ids.tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 4], [0, 0, 4]]
    assert b.prompt_mask.tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert b.response_ids.tolist() == [[8, 1, 0], [9, 9, 9], [3, 0, 0], [2, 1, 0]]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert b.group_ids.tolist() == [0, 0, 1, 1]
    assert b.truncated.tolist() == [False, True, False, False]
    assert torch.allclose(b.rollout_logprobs[1], torch.tensor([-1.0, -2.0, -3.0]))
    assert b.input_ids.shape == (4, 6) and b.attention_mask.sum().item() == 8 + 8


def test_split_then_cat_round_trips():
    b = RolloutBatch.from_groups(_groups(), PAD)
    b.rewards = torch.tensor([1.0, 0.0, 0.5, 0.25])
    b.meta["answers"] = ["a", "a", "b", "b"]
    parts = b.split(3)
    assert [len(p) for p in parts] == [3, 1]
    assert parts[1].meta["answers"] == ["b"]
    back = RolloutBatch.cat(parts)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group_ids", "rewards", "rollout_logprobs"):
        assert torch.equal(getattr(back, name), getattr(b, name)), name
    assert back.meta["answers"] == b.meta["answers"]


def test_cat_repads_different_widths():
    g = _groups()
    a = RolloutBatch.from_groups(g[:1], PAD)
    c = RolloutBatch.from_groups(g[1:], PAD)
    assert c.prompt_ids.shape == (2, 1) and c.response_ids.shape == (2, 2)
    joined = RolloutBatch.cat([c, a])
    assert joined.prompt_ids.tolist()[:2] == [[0, 0, 4], [0, 0, 4]]
    assert joined.response_mask.tolist()[:2] == [[1, 0, 0], [1, 1, 0]]
