"""Deterministic, resumable batch sampling over a prompt dataset (epoch shuffling, exact resume)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")


class EpochSampler:
    """An endless stream of index batches; epoch `e` is a permutation seeded by `(seed, e)`.

    Because each epoch's order depends only on `(seed, epoch)`, the whole state is two integers
    (epoch, offset into the epoch), so a resumed sampler continues with exactly the batches the
    original would have produced.
    """

    def __init__(
        self,
        num_items: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_items <= 0:
            raise ValueError("cannot sample from an empty dataset")
        if drop_last and num_items < batch_size:
            raise ValueError(
                f"batch_size {batch_size} exceeds the dataset size {num_items} with drop_last=True"
            )
        self.num_items = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.offset = 0
        self._order: np.ndarray | None = None

    @property
    def batches_per_epoch(self) -> int:
        """Number of batches in one pass over the data."""
        full, rest = divmod(self.num_items, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _epoch_order(self) -> np.ndarray:
        if self._order is None:
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_items)
            else:
                self._order = np.arange(self.num_items)
        return self._order

    def _epoch_end(self) -> int:
        """Index in the epoch's order past which no batch starts."""
        if self.drop_last:
            return self.num_items - self.num_items % self.batch_size
        return self.num_items

    def next_batch(self) -> list[int]:
        """Indices of the next batch; moves to a new shuffled epoch when this one is used up."""
        if self.offset >= self._epoch_end():
            self.epoch += 1
            self.offset = 0
            self._order = None
        order = self._epoch_order()
        batch = order[self.offset : self.offset + self.batch_size]
        self.offset += len(batch)
        return [int(i) for i in batch]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this sampler is."""
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "num_items": self.num_items,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`; fails if it was saved for a different dataset or setting."""
        for key in ("seed", "num_items", "batch_size", "shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state was saved with {key}={state[key]!r} but this sampler has "
                    f"{key}={getattr(self, key)!r}"
                )
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self._order = None


class PromptDataLoader(Generic[T]):
    """Yields lists of dataset items in the order of an `EpochSampler`; resumable via `state_dict`."""

    def __init__(
        self,
        dataset: Sequence[T],
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        self.dataset = dataset
        self.sampler = EpochSampler(len(dataset), batch_size, seed=seed, shuffle=shuffle, drop_last=drop_last)

    @property
    def epoch(self) -> int:
        """The epoch the last returned batch came from (0-based)."""
        return self.sampler.epoch

    @property
    def batches_per_epoch(self) -> int:
        """Number of batches in one pass over the data."""
        return self.sampler.batches_per_epoch

    def next_batch(self) -> list[T]:
        """The next batch of items."""
        return [self.dataset[i] for i in self.sampler.next_batch()]

    def __iter__(self) -> Iterator[list[T]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """The sampler position (the dataset itself is rebuilt from its files)."""
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position."""
        self.sampler.load_state_dict(state["sampler"])
