"""Shared-memory segments for same-node transfers: a sender-side pool and a receiver-side map cache.

Segments are anonymous ``memfd`` files, passed to the receiver over a Unix socket (``SCM_RIGHTS``),
so nothing is left behind in ``/dev/shm`` when a process dies and the ``/dev/shm`` size limit of
containers does not apply. The first ``HEADER`` bytes hold one release flag per receiver: the sender
sets a receiver's flag before sending, the receiver clears it when the last tensor viewing the
segment is garbage-collected. A segment whose flags are all clear is reused, so steady-state
transfers write into memory that is already mapped and faulted in (no per-message page faults).
The receiver never copies: it gets tensors that view the segment directly.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

log = logging.getLogger(__name__)

HEADER = 4096  # release flags: one byte per receiver slot
MAX_SLOTS = HEADER
ALIGN = 64  # buffer offsets inside a segment, so every dtype view is aligned
GRANULE = 1 << 20  # segment sizes are rounded up to this
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(sizes: list[int]) -> tuple[list[int], int]:
    """Offsets of buffers packed after the header, and the bytes a segment needs to hold them."""
    offsets, pos = [], HEADER
    for n in sizes:
        offsets.append(pos)
        pos = align(pos + n)
    return offsets, pos


class SegmentRef(NamedTuple):
    """What a receiver needs to map a segment (the fd travels beside it)."""

    owner: str
    seg_id: int
    capacity: int
    ephemeral: bool


class Segment:
    """One memfd-backed buffer owned by a sender."""

    def __init__(self, owner: str, seg_id: int, capacity: int, ephemeral: bool) -> None:
        self.ref = SegmentRef(owner, seg_id, capacity, ephemeral)
        self.fd = os.memfd_create(f"m2flow-{seg_id}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, capacity)
        self._mm = mmap.mmap(self.fd, capacity, flags=_MAP_FLAGS)
        self.array = np.frombuffer(self._mm, dtype=np.uint8)  # shape (capacity,)
        self.flags = self.array[:HEADER]
        self.peers: set[str] = set()  # connections that were handed this segment's fd

    @property
    def capacity(self) -> int:
        return self.ref.capacity

    def is_free(self) -> bool:
        return not self.flags.any()

    def close(self) -> None:
        # Receivers keep their own mappings; the memory goes when the last one is unmapped.
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.array = self.flags = None  # type: ignore[assignment]
        self._mm = None  # type: ignore[assignment]


class SegmentPool:
    """Sender-side segments reused across messages; past ``max_pooled_bytes`` segments are one-off."""

    _ids = itertools.count()

    def __init__(self, owner: str, max_pooled_bytes: int = 2 << 30) -> None:
        self.owner = owner
        self.max_pooled_bytes = max_pooled_bytes
        self._pooled: list[Segment] = []
        self._ephemeral: list[Segment] = []
        self._forget: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def acquire(self, nbytes: int, nslots: int = 1) -> Segment:
        """A segment with room for ``nbytes`` after the header, flags of ``nslots`` receivers set."""
        if not 1 <= nslots <= MAX_SLOTS:
            raise ValueError(f"a segment serves 1..{MAX_SLOTS} receivers, not {nslots}")
        need = HEADER + nbytes
        with self._lock:
            self._reap()
            fits = [s for s in self._pooled if need <= s.capacity <= 2 * need + GRANULE and s.is_free()]
            if fits:
                seg = min(fits, key=lambda s: s.capacity)
            else:
                seg = self._create(need)
            seg.flags[:nslots] = 1
            return seg

    def _create(self, need: int) -> Segment:
        size = (need + GRANULE - 1) // GRANULE * GRANULE
        pooled = sum(s.capacity for s in self._pooled)
        if pooled + size > self.max_pooled_bytes:
            for seg in sorted((s for s in self._pooled if s.is_free()), key=lambda s: -s.capacity):
                self._retire(seg)
                pooled -= seg.capacity
                if pooled + size <= self.max_pooled_bytes:
                    break
        ephemeral = pooled + size > self.max_pooled_bytes
        seg = Segment(self.owner, next(self._ids), size, ephemeral)
        (self._ephemeral if ephemeral else self._pooled).append(seg)
        return seg

    def _retire(self, seg: Segment) -> None:
        self._pooled.remove(seg)
        for peer in seg.peers:
            self._forget.setdefault(peer, []).append(seg.ref.seg_id)
        seg.close()

    def _reap(self) -> None:
        keep = []
        for seg in self._ephemeral:
            if seg.is_free():
                seg.close()
            else:
                keep.append(seg)
        self._ephemeral = keep

    def take_forgets(self, peer: str) -> list[int]:
        """Ids of retired segments whose mapping ``peer`` may drop."""
        with self._lock:
            return self._forget.pop(peer, [])

    def busy_bytes(self) -> int:
        with self._lock:
            return sum(s.capacity for s in self._pooled + self._ephemeral if not s.is_free())

    def close(self) -> None:
        with self._lock:
            for seg in self._pooled + self._ephemeral:
                seg.close()
            self._pooled, self._ephemeral = [], []


def _release(flags: np.ndarray, slot: int) -> None:
    flags[slot] = 0


class SegmentCache:
    """Receiver-side mappings of senders' segments, least recently used dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int = 4 << 30) -> None:
        self.max_bytes = max_bytes
        self._maps: OrderedDict[tuple[str, int], mmap.mmap] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def _map(self, ref: SegmentRef, fd: int) -> mmap.mmap:
        key = (ref.owner, ref.seg_id)
        with self._lock:
            mm = self._maps.get(key)
            if mm is not None:
                self._maps.move_to_end(key)
                os.close(fd)
                return mm
            try:
                mm = mmap.mmap(fd, ref.capacity, flags=_MAP_FLAGS)
            finally:
                os.close(fd)
            if not ref.ephemeral:
                self._maps[key] = mm
                self._bytes += ref.capacity
                while self._bytes > self.max_bytes and len(self._maps) > 1:
                    _, old = self._maps.popitem(last=False)
                    self._bytes -= len(old)
            return mm

    def forget(self, owner: str, seg_ids: list[int]) -> None:
        """Drop mappings the sender retired; tensors still viewing them keep them alive."""
        with self._lock:
            for seg_id in seg_ids:
                mm = self._maps.pop((owner, seg_id), None)
                if mm is not None:
                    self._bytes -= len(mm)

    def views(self, ref: SegmentRef, fd: int, slot: int, ranges: list[tuple[int, int]],
              release: bool = True) -> list[np.ndarray]:
        """Zero-copy uint8 views of ``(offset, nbytes)`` ranges; the slot's flag clears when all die
        (never, with ``release`` False: a reader that is not the message's last keeps it set)."""
        mm = self._map(ref, fd)
        # A fresh array per message is the one object every view below keeps alive (numpy points
        # each slice's ``base`` at it), so its finalizer runs exactly when the receiver has dropped
        # every tensor and array of this message.
        base = np.frombuffer(mm, dtype=np.uint8)
        out = [base[off : off + n] for off, n in ranges]
        if release:
            weakref.finalize(base, _release, np.frombuffer(mm, dtype=np.uint8, count=HEADER), slot)
        return out

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()
            self._bytes = 0
