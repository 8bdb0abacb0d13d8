"""The epoch sampler and prompt loader: determinism, epoch shuffling, exact resume."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2flow.data.sampler import EpochSampler, PromptDataLoader


def test_each_epoch_is_a_permutation_and_epochs_differ():
    s = EpochSampler(10, batch_size=5, seed=3)
    epoch0 = s.next_batch() + s.next_batch()
    epoch1 = s.next_batch() + s.next_batch()
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1
    assert s.epoch == 1


def test_same_seed_same_order_other_seed_other_order():
    a = [EpochSampler(20, 4, seed=1).next_batch() for _ in range(1)]
    b = [EpochSampler(20, 4, seed=1).next_batch() for _ in range(1)]
    c = [EpochSampler(20, 4, seed=2).next_batch() for _ in range(1)]
    assert a == b and a != c


def test_drop_last_and_keep_last():
    s = EpochSampler(7, batch_size=3, seed=0, shuffle=False)
    assert [s.next_batch() for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]
    s = EpochSampler(7, batch_size=3, seed=0, shuffle=False, drop_last=False)
    assert [s.next_batch() for _ in range(4)] == [[0, 1, 2], [3, 4, 5], [6], [0, 1, 2]]
    assert s.batches_per_epoch == 3


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 30),
    batch=st.integers(1, 8),
    seed=st.integers(0, 1000),
    cut=st.integers(0, 20),
    drop_last=st.booleans(),
)
def test_resume_continues_exactly(n, batch, seed, cut, drop_last):
    if drop_last and batch > n:
        return
    ref = EpochSampler(n, batch, seed=seed, drop_last=drop_last)
    expected = [ref.next_batch() for _ in range(cut + 10)]
    first = EpochSampler(n, batch, seed=seed, drop_last=drop_last)
    got = [first.next_batch() for _ in range(cut)]
    resumed = EpochSampler(n, batch, seed=seed, drop_last=drop_last)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next_batch() for _ in range(10)]
    assert got == expected


def test_state_from_another_setting_is_refused():
    s = EpochSampler(10, 2, seed=0)
    with pytest.raises(ValueError, match="seed=0 but this sampler has seed=1"):
        EpochSampler(10, 2, seed=1).load_state_dict(s.state_dict())


def test_invalid_sizes():
    with pytest.raises(ValueError, match="exceeds the dataset size"):
        EpochSampler(3, 4)
    with pytest.raises(ValueError, match="empty dataset"):
        EpochSampler(0, 1)


def test_loader_returns_items_and_resumes():
    data = [f"item{i}" for i in range(9)]
    loader = PromptDataLoader(data, batch_size=4, seed=5)
    first = loader.next_batch()
    assert len(first) == 4 and set(first) <= set(data)
    state = loader.state_dict()
    after = [loader.next_batch() for _ in range(3)]
    other = PromptDataLoader(data, batch_size=4, seed=5)
    other.load_state_dict(state)
    assert [other.next_batch() for _ in range(3)] == after
