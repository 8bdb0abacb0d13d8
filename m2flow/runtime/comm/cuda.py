"""GPU paths: CUDA IPC when the receiver sees the tensor's GPU, NCCL between different GPUs.

Both are chosen per tensor while a payload is encoded (``GpuReducer``), so one message may mix
host bytes, IPC handles and NCCL tensors; everything else about the message (ordering, framing,
small objects) stays on the pair's socket. Devices are matched by UUID, because each Ray worker
numbers only its visible GPUs.

* IPC: the sender clones the tensor (the receiver then owns a private copy, as with every other
  transport) and sends its IPC handle; torch keeps the clone alive until the receiver releases it.
* NCCL: the pair shares a two-rank ``ProcessGroupNCCL`` created on first use through a TCPStore
  hosted by the sender; tensors follow their frame in order on the same stream of sends.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import torch

from m2flow.runtime.comm.rendezvous import PeerRecord
from m2flow.runtime.comm.serialization import Encoded, _dtype_name, _rebuild_gpu
from m2flow.runtime.dist_store import tcp_store

log = logging.getLogger(__name__)
_STORAGE_DEVICE_ARG = 6  # position of ``storage_device`` in torch's rebuild_cuda_tensor arguments


def device_uuid(device: torch.device | int) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def local_device(uuid: str) -> int:
    """This process's index of the GPU with ``uuid``."""
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == uuid:
            return i
    raise RuntimeError(f"GPU {uuid} is not visible in this process")


def _rebuild_ipc(uuid: str, fn: Any, args: tuple, param: bool) -> torch.Tensor:
    args = list(args)
    args[_STORAGE_DEVICE_ARG] = local_device(uuid)
    t = fn(*args)
    return torch.nn.Parameter(t, requires_grad=t.requires_grad) if param else t


class GpuReducer:
    """Decides, per CUDA tensor of a payload, how it reaches ``peer``: IPC, NCCL, or the host."""

    def __init__(self, peer: PeerRecord, same_node: bool) -> None:
        self.peer_uuids = set(peer.cuda_uuids)
        self.same_node = same_node

    def __call__(self, obj: torch.Tensor, enc: Encoded) -> Any:
        if not self.peer_uuids:
            return NotImplemented  # a receiver without GPUs gets host bytes
        t = obj.detach()
        if self.same_node and device_uuid(t.device) in self.peer_uuids:
            from torch.multiprocessing.reductions import reduce_tensor

            fn, args = reduce_tensor(t.clone())
            return _rebuild_ipc, (device_uuid(t.device), fn, args, isinstance(obj, torch.nn.Parameter))
        index = len(enc.gpu)
        enc.gpu.append(t.contiguous())
        enc.gpu_specs.append((_dtype_name(t.dtype), tuple(t.shape)))
        return _rebuild_gpu, (index,)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class NcclPair:
    """A two-rank NCCL group between one sender (rank 0) and one receiver (rank 1)."""

    def __init__(self, host: str, port: int, rank: int, timeout_s: float = 300.0) -> None:
        import torch.distributed as dist

        self.rank = rank
        store = tcp_store(host, port, 2, serve=rank == 0, timeout_s=timeout_s)
        self.pg = dist.ProcessGroupNCCL(store, rank, 2, dist.ProcessGroupNCCL.Options())
        self._lock = threading.Lock()

    def send(self, tensors: list[torch.Tensor]) -> None:
        with self._lock:
            for t in tensors:
                self.pg.send([t], 1 - self.rank, 0).wait()

    def recv(self, specs: tuple[tuple[str, tuple[int, ...]], ...]) -> list[torch.Tensor]:
        device = torch.device("cuda", torch.cuda.current_device())
        out = [torch.empty(shape, dtype=getattr(torch, dtype), device=device) for dtype, shape in specs]
        with self._lock:
            for t in out:
                self.pg.recv([t], 1 - self.rank, 0).wait()
        torch.cuda.current_stream(device).synchronize()
        return out
