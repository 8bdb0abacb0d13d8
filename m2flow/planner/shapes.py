"""The candidate set's structure: shapes (which components share blocks of devices) and device splits.

A shape splits the running components into blocks on disjoint device ranges (one block: collocated;
several: disaggregated), optionally with one component over all blocks or on the first devices of
one block (hybrid). A split is the device count of each block.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """Blocks of components on disjoint device ranges; possibly one more component over all of them
    (``wide``) or on the first devices of one block (``inner``: component, block index)."""

    blocks: tuple[tuple[str, ...], ...]
    wide: str | None = None
    inner: tuple[str, int] | None = None

    @property
    def mode(self) -> str:
        if self.wide is not None or self.inner is not None:
            return "hybrid"
        return "collocated" if len(self.blocks) == 1 else "disaggregated"


def set_partitions(items: Sequence[str]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every partition of ``items`` into blocks, blocks in order of their first item."""
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield ((first,),) + part
        for i in range(len(part)):
            yield part[:i] + ((first,) + part[i],) + part[i + 1:]


def shapes(running: Sequence[str]) -> list[Shape]:
    """Collocated, every disaggregated split, and the hybrids: one component over the others' blocks,
    or one component on part of one block's devices (e.g. the actor on one of the env ranks' devices)."""
    out = [Shape(tuple(p)) for p in set_partitions(list(running))]
    for one in running:
        rest = [c for c in running if c != one]
        for p in set_partitions(rest):
            if len(p) >= 2:
                out.append(Shape(tuple(p), wide=one))
            out += [Shape(tuple(p), inner=(one, b)) for b in range(len(p))]
    return out


def compositions(n: int, m: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``n`` as ``m`` positive parts, in order."""
    for cuts in itertools.combinations(range(1, n), m - 1):
        yield tuple(b - a for a, b in zip((0,) + cuts, cuts + (n,)))


def grid_splits(n: int, m: int, divisions: int = 8) -> list[tuple[int, ...]]:
    """Splits of ``n`` into ``m`` parts that are multiples of n/``divisions`` (the coarse start of the local
    search; the last part takes the remainder)."""
    unit = max(1, n // divisions)
    whole = n // unit
    return [tuple(p * unit for p in c[:-1]) + (n - unit * sum(c[:-1]),) for c in compositions(whole, m)]
