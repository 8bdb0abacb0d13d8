"""Split any picklable payload into small metadata bytes and raw buffers, so tensor bytes skip pickle.

Tensors (plain and ``nn.Parameter``, any dtype including bfloat16, any strides, any device) are
pulled out of the object graph with ``reducer_override``; other out-of-band buffers (numpy arrays)
come through pickle protocol 5. What is left is pickled normally. The receiver rebuilds each tensor
as a view over whatever memory the transport gave it (a shared-memory segment, a socket buffer),
so a transport decides how many copies a message costs, not this module.

torch is imported only where a tensor is built: a process that has not imported torch holds no
tensor, so a channel host, which moves bytes only, never pays torch's start-up.

Deviations worth knowing: autograd history is not sent (tensors arrive detached, ``requires_grad``
kept); two views of one storage arrive as two separate tensors; the same tensor object appearing
twice arrives as one object (pickle's memo).
"""

from __future__ import annotations

import io
import pickle
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import torch

BufferKind = Literal["tensor", "param", "pickle"]


class BufferSpec(NamedTuple):
    """How to rebuild one raw buffer on the receiving side."""

    kind: BufferKind
    nbytes: int
    dtype: str = "uint8"  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...] = ()
    requires_grad: bool = False
    device: str = "cpu"  # where the tensor lived at the sender


@dataclass
class Encoded:
    """A payload split for transport: ``meta`` is pickled, ``sources`` are the raw buffers."""

    meta: bytes
    specs: list[BufferSpec] = field(default_factory=list)
    # torch.Tensor (any device/strides) for tensor kinds, contiguous memoryview for "pickle".
    sources: list[Any] = field(default_factory=list)
    # CUDA tensors a GPU transport sends beside the frame (NCCL), with (dtype, shape) each.
    gpu: list[torch.Tensor] = field(default_factory=list)
    gpu_specs: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def has_cuda(self) -> bool:
        return any(s.device.startswith("cuda") for s in self.specs)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _rebuild_tensor(index: int) -> torch.Tensor:
    return _DECODING.tensors[index]


_DECODING = threading.local()
_SENDABLE_TYPES: tuple[type, ...] = ()  # (torch.Tensor, torch.nn.Parameter) once this process has torch


def _sendable_types() -> tuple[type, ...]:
    global _SENDABLE_TYPES
    if not _SENDABLE_TYPES:
        loaded = sys.modules.get("torch")
        if loaded is not None and hasattr(loaded, "nn"):  # fully imported, not mid-import
            _SENDABLE_TYPES = (loaded.Tensor, loaded.nn.Parameter)
    return _SENDABLE_TYPES


def _is_tensor(obj: Any) -> bool:
    loaded = sys.modules.get("torch")
    return loaded is not None and isinstance(obj, loaded.Tensor)


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5, buffer_callback=self._out_of_band)
        self.out = file
        self._encoded: Encoded | None = None
        self.gpu_reducer: GpuReducer | None = None

    def _out_of_band(self, buf: pickle.PickleBuffer) -> bool:
        assert self._encoded is not None
        try:
            raw = buf.raw()
        except BufferError:  # non-contiguous: let pickle copy it in-band
            return True
        self._encoded.specs.append(BufferSpec("pickle", raw.nbytes))
        self._encoded.sources.append(raw)
        return False

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) not in (_SENDABLE_TYPES or _sendable_types()):
            return NotImplemented
        import torch

        assert self._encoded is not None
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta":
            return NotImplemented  # rare kinds keep torch's own pickling
        t = obj.detach()
        if t.is_cuda and self.gpu_reducer is not None:
            return self.gpu_reducer(obj, self._encoded)
        spec = BufferSpec(
            kind="param" if isinstance(obj, torch.nn.Parameter) else "tensor",
            nbytes=t.numel() * t.element_size(),
            dtype=_dtype_name(t.dtype),
            shape=tuple(t.shape),
            requires_grad=obj.requires_grad,
            device=str(t.device),
        )
        index = len(self._encoded.specs)
        self._encoded.specs.append(spec)
        self._encoded.sources.append(t)
        return _rebuild_tensor, (index,)


_PICKLERS = threading.local()


GpuReducer = Callable[["torch.Tensor", Encoded], tuple]


def encode(obj: Any, gpu_reducer: GpuReducer | None = None) -> Encoded:
    """Split ``obj`` into pickled metadata and the raw buffers of its tensors and arrays.

    CUDA tensors are copied to the host unless ``gpu_reducer`` (see ``cuda.py``) handles them.
    """
    encoded = Encoded(meta=b"")
    # Building a Pickler costs more than pickling a small object: keep one per thread.
    pickler = getattr(_PICKLERS, "pickler", None)
    if pickler is None or pickler._encoded is not None:  # absent, or in use by a nested encode
        pickler = _PICKLERS.pickler = _Pickler(io.BytesIO())
    out = pickler.out
    pickler._encoded = encoded
    pickler.gpu_reducer = gpu_reducer
    try:
        pickler.dump(obj)
        encoded.meta = out.getvalue()
    finally:
        pickler._encoded = None
        pickler.gpu_reducer = None
        pickler.clear_memo()  # also drops references to the payload
        out.seek(0)
        out.truncate()
    return encoded


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of ``t``'s elements, shape (nbytes,); copies only if ``t`` is strided."""
    import torch

    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def source_bytes(src: Any) -> memoryview:
    """The bytes of one source buffer as a CPU memoryview (a device-to-host copy for CUDA)."""
    if _is_tensor(src):
        flat = tensor_bytes(src)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        return memoryview(flat.numpy())
    return src


def copy_into(dst: np.ndarray, src: Any) -> None:
    """Copy one source buffer into ``dst`` (uint8, shape (nbytes,)) without intermediate copies."""
    if dst.nbytes == 0:
        return
    if _is_tensor(src):
        import torch

        if src.device.type == "cpu" and src.is_contiguous():
            # numpy's copy is a plain memcpy; torch's copy_ is measurably slower for bytes
            np.copyto(dst, src.reshape(-1).view(torch.uint8).numpy())
        else:  # device-to-host or strided: copy the elements straight into place
            torch.from_numpy(dst).view(src.dtype).view(src.shape).copy_(src)
    else:
        dst[:] = np.frombuffer(src, dtype=np.uint8)


def _as_tensor(spec: BufferSpec, buf: Any) -> torch.Tensor:
    import torch

    dtype = getattr(torch, spec.dtype)
    if spec.nbytes == 0:  # an empty array's stride is 0: nothing to view
        t = torch.empty(spec.shape, dtype=dtype)
    else:
        flat = torch.from_numpy(buf) if isinstance(buf, np.ndarray) else buf
        t = flat.view(dtype).reshape(spec.shape)
    if spec.device.startswith("cuda") and t.device.type == "cpu" and torch.cuda.is_available():
        t = t.to(torch.device("cuda", torch.cuda.current_device()))
    if spec.kind == "param":
        return torch.nn.Parameter(t, requires_grad=spec.requires_grad)
    if spec.requires_grad and t.is_floating_point():
        t.requires_grad_(True)
    return t


def _rebuild_gpu(index: int) -> torch.Tensor:
    return _DECODING.gpu[index]


def decode(meta: bytes, specs: list[BufferSpec], buffers: list[Any], gpu: list[torch.Tensor] | None = None) -> Any:
    """Rebuild a payload from its metadata and one buffer per spec (uint8 numpy arrays or tensors);
    ``gpu`` holds the CUDA tensors a GPU transport delivered beside the frame."""
    tensors: list[Any] = []
    pickle_buffers: list[Any] = []
    for spec, buf in zip(specs, buffers, strict=True):
        if spec.kind == "pickle":
            pickle_buffers.append(buf)
            tensors.append(None)
        else:
            tensors.append(_as_tensor(spec, buf))
    previous = getattr(_DECODING, "tensors", None), getattr(_DECODING, "gpu", None)
    _DECODING.tensors, _DECODING.gpu = tensors, gpu
    try:
        return pickle.loads(meta, buffers=pickle_buffers)
    finally:
        _DECODING.tensors, _DECODING.gpu = previous
