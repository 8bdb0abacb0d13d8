"""Place an encoded payload for one transport: inline in the frame, or in a shared-memory segment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from m2flow.runtime.comm.serialization import (
    BufferSpec,
    Encoded,
    copy_into,
    decode,
    source_bytes,
)
from m2flow.runtime.comm.shm import (
    HEADER,
    Segment,
    SegmentCache,
    SegmentPool,
    SegmentRef,
    layout,
)

SHM_MIN_BYTES = 256 << 10  # below this, two socket copies beat mapping a segment


class Desc(NamedTuple):
    """The wire description of one payload; tensor bytes are inline or in ``seg``."""

    meta: bytes
    specs: tuple[BufferSpec, ...]
    offsets: tuple[int, ...] = ()  # where each buffer sits in ``seg``
    seg: SegmentRef | None = None
    slot: int = 0  # this receiver's release flag in ``seg``
    gpu: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (dtype, shape) of tensors sent by NCCL

    def for_slot(self, slot: int) -> Desc:
        return self._replace(slot=slot)

    def to_wire(self) -> tuple:
        """Plain tuples only: pickling them is several times cheaper than named types."""
        seg = tuple(self.seg) if self.seg is not None else None
        return (self.meta, tuple(map(tuple, self.specs)), self.offsets, seg, self.slot, self.gpu)

    @classmethod
    def from_wire(cls, t: tuple) -> Desc:
        meta, specs, offsets, seg, slot, gpu = t
        return cls(meta, tuple(BufferSpec(*s) for s in specs), offsets, SegmentRef(*seg) if seg else None, slot, gpu)


@dataclass
class Packed:
    """A payload ready to send: the description, inline buffers, and the segment if any."""

    desc: Desc
    inline: list[Any]
    segment: Segment | None = None
    gpu_tensors: list[Any] = field(default_factory=list)  # sent by NCCL after the frame

    @property
    def fds(self) -> list[int]:
        return [self.segment.fd] if self.segment is not None else []


def pack(enc: Encoded, pool: SegmentPool | None, nslots: int = 1, shm_min_bytes: int = SHM_MIN_BYTES) -> Packed:
    """Copy tensor bytes into one segment (same node, large) or leave them as inline buffers."""
    specs = tuple(enc.specs)
    gpu = tuple(enc.gpu_specs)
    if pool is None or enc.nbytes < shm_min_bytes:
        return Packed(Desc(enc.meta, specs, gpu=gpu), [source_bytes(s) for s in enc.sources], gpu_tensors=enc.gpu)
    offsets, need = layout([s.nbytes for s in specs])
    seg = pool.acquire(need - HEADER, nslots)
    try:
        for off, spec, src in zip(offsets, specs, enc.sources, strict=True):
            copy_into(seg.array[off : off + spec.nbytes], src)
    except BaseException:
        seg.flags[:nslots] = 0
        raise
    return Packed(Desc(enc.meta, specs, tuple(offsets), seg.ref, gpu=gpu), [], seg, enc.gpu)


def unpack(desc: Desc, inline: list[Any], fds: list[int], cache: SegmentCache, gpu: list[Any] | None = None) -> Any:
    """Rebuild the payload; segment-backed tensors are zero-copy views of the sender's memory."""
    return decode(desc.meta, list(desc.specs), buffers(desc, inline, fds, cache), gpu)


def buffers(desc: Desc, inline: list[Any], fds: list[int], cache: SegmentCache, release: bool = True) -> list[Any]:
    if desc.seg is None:
        return inline
    ranges = [(off, s.nbytes) for off, s in zip(desc.offsets, desc.specs, strict=True)]
    return cache.views(desc.seg, fds[0], desc.slot, ranges, release)


def inline_copy(desc: Desc, inline: list[Any], fds: list[int], cache: SegmentCache,
                release: bool = True) -> tuple[Desc, list[Any]]:
    """The same payload with its bytes inline, for a receiver that cannot map the segment.

    With ``release`` the sender may reuse the segment once the copy is written; without, the
    caller still answers for the payload and releases it later (`discard`).
    """
    if desc.seg is None:
        return desc, inline
    return desc._replace(offsets=(), seg=None, slot=0), buffers(desc, inline, fds, cache, release)


def discard(desc: Desc, fds: list[int], cache: SegmentCache) -> None:
    """Drop a payload that will never be decoded, releasing its segment flag."""
    if desc.seg is not None:
        cache.views(desc.seg, fds[0], desc.slot, [])
