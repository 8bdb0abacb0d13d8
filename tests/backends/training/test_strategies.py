"""DDP and FSDP2 on two gloo ranks: reduced gradients equal the single-process sum, state round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from m2flow.backends.training import create_strategy
from m2flow.runtime import Worker, WorkerGroup
from tests.ray_session import shared_cluster


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) + x


class Net(nn.Module):
    _no_split_modules = ["Block"]  # as Hugging Face models list their transformer blocks

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(6), Block(6)])
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _data(rank: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(3, 6, generator=g) for _ in range(n)]


def reference_grads(micro_batches: dict[int, int], scale: float) -> dict[str, torch.Tensor]:
    """Gradient of scale x (sum of all ranks' losses) computed in one process."""
    net = _net()
    loss = sum(net(x).pow(2).sum() for r, n in micro_batches.items() for x in _data(r, n))
    (loss * scale).backward()
    return {k: p.grad for k, p in net.named_parameters()}


class Trainer(Worker):
    def __init__(self, strategy: str) -> None:
        self.init_process_group()
        self.strategy = create_strategy(strategy, _net(), "cpu")

    def grads(self, micro_batches: dict[int, int], scale: float) -> dict[str, torch.Tensor]:
        xs = _data(self.rank, micro_batches[self.rank])
        for i, x in enumerate(xs):
            with self.strategy.accumulate(last=i == len(xs) - 1):
                self.strategy.module(x).pow(2).sum().backward()
        self.strategy.reduce_gradients(scale)
        out = {}
        for name, p in self.strategy.module.named_parameters():
            g = p.grad
            out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
        return out

    def step(self) -> tuple[dict, dict]:
        """One AdamW step; the full weights and the optimizer state as a checkpoint would hold them."""
        opt = torch.optim.AdamW(self.strategy.parameters(), lr=0.1)
        opt.step()
        return self.strategy.full_state_dict(), self.strategy.optim_state_dict(opt)

    def reload(self, state: dict) -> dict:
        """Load rank 0's saved optimizer state into a fresh optimizer; what it would save again."""
        fresh = torch.optim.AdamW(self.strategy.parameters(), lr=0.1)
        self.strategy.load_optim_state_dict(fresh, state)
        return self.strategy.optim_state_dict(fresh)


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def trainers(request):
    group = WorkerGroup(Trainer, shared_cluster(), f"train-{request.param}", num_ranks=2, args=(request.param,))
    yield request.param, group
    group.shutdown()


def test_reduced_gradients_equal_the_single_process_gradient(trainers):
    name, group = trainers
    # DDP reduces once per step, so ranks may run different numbers of micro-batches; FSDP is lockstep.
    counts = {0: 2, 1: 1} if name == "ddp" else {0: 2, 1: 2}
    scale = 1 / 9
    got = group.grads(counts, scale).wait()
    want = reference_grads(counts, scale)
    for rank_grads in got:
        for k, g in want.items():
            assert torch.allclose(rank_grads[k], g, atol=1e-6), k


def test_full_weights_and_optimizer_state_round_trip(trainers):
    name, group = trainers
    group.grads({0: 1, 1: 1}, 1.0).wait()
    (weights, state), (weights1, _) = group.step().wait()
    again = group.reload(state).wait()[0]  # every rank loads what rank 0 saved
    shapes = {k: p.shape for k, p in _net().named_parameters()}
    assert {k: w.shape for k, w in weights.items()} == shapes
    if name == "fsdp":
        assert weights1 == {}  # rank 0 alone receives the gathered weights
    exp_avg = lambda s: [v["exp_avg"] for v in s["state"].values()]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(exp_avg(state), exp_avg(again)))


class ShardedTrainer(Worker):
    """A model trained with FSDP2 and AdamW, checkpointed per rank."""

    def __init__(self) -> None:
        self.init_process_group()
        from m2flow.backends.training import OptimConfig
        from m2flow.workers.trainable import TrainedModel

        self.model = TrainedModel(_net(), "fsdp", torch.device("cpu"), OptimConfig(lr=0.1), total_steps=10)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            x = _data(self.rank, 1)[0]
            with self.model.strategy.accumulate(last=True):
                self.model.module(x).pow(2).sum().backward()
            self.model.apply_update(1.0)

    def save(self, path: str) -> dict:
        return self.model.save_sharded(Path(path))

    def load(self, path: str, plain: dict) -> None:
        self.model.load_sharded(Path(path), plain)

    def local_state(self) -> dict[str, torch.Tensor]:
        """This rank's own shards of weights and Adam moments, as plain tensors."""
        out = {f"w.{k}": p.to_local().clone() for k, p in self.model.module.named_parameters()}
        for i, s in self.model.optimizer.state.items():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                v = s[key]
                out[f"o.{i}.{key}"] = (v.to_local() if hasattr(v, "to_local") else v).clone()
        return out


def test_fsdp_checkpoints_per_rank_and_resumes_exactly(tmp_path):
    from m2flow.backends.training import sharded_checkpoint

    group = WorkerGroup(ShardedTrainer, shared_cluster(), "sharded", num_ranks=2)
    try:
        group.train(2).wait()
        plain = group.save(str(tmp_path / "shards")).wait()[0]
        files = sorted(p.name for p in (tmp_path / "shards").iterdir())
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shards
        group.train(2).wait()
        straight = group.local_state().wait()
        group.train(3).wait()  # move away, then come back from the checkpoint
        group.load(str(tmp_path / "shards"), plain).wait()
        group.train(2).wait()
        resumed = group.local_state().wait()
    finally:
        group.shutdown()
    for a, b in zip(straight, resumed):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    whole = sharded_checkpoint.load_full(tmp_path / "shards", "model")  # one process reads both ranks' shards
    assert {k: v.shape for k, v in whole.items()} == {k: p.shape for k, p in _net().named_parameters()}
