"""The runtime demo's workers: producers make batches of numbers, scalers double them, reducers average."""

from __future__ import annotations

from dataclasses import dataclass

from m2flow.runtime.worker import Worker


@dataclass(frozen=True, kw_only=True)
class ProducerSettings:
    """What a producer rank makes."""

    batch_size: int
    """numbers per batch"""


class Producer(Worker):
    def __init__(self, *, settings: ProducerSettings) -> None:
        import torch

        self.gen = torch.Generator().manual_seed(self.rank)
        self.batch_size = settings.batch_size

    def make(self, step: int):
        import torch

        self.log.info("batch %d", step)
        return torch.rand(self.batch_size, generator=self.gen)


class Scaler(Worker):
    def scale(self, batches: list):
        import torch

        with self.device_turn():
            return torch.cat(batches) * 2.0


class Reducer(Worker):
    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, parts: list) -> float:
        with self.device_turn():
            for t in parts:
                self.total += float(t.sum())
                self.count += t.numel()
        return self.total / max(self.count, 1)
