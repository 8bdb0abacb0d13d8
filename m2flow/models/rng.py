"""Seeded use of torch's global random generator by code that cannot take a generator of its own.

torch's global generator is one per process. Ranks of the local executor share the driver process, so
a block that seeds it and draws from it (Hugging Face ``generate``, a module's initialisation) must not
interleave with another rank's: ``seeded`` holds a process-wide lock for the block, forks the global
state (restored afterwards, as ``torch.random.fork_rng``) and seeds it. Code that can pass a
``torch.Generator`` should do that instead; it needs no lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_GLOBAL_RNG = threading.RLock()


@contextmanager
def seeded(seed: int | None, devices: Sequence[Any] = ()) -> Iterator[None]:
    """Run the block alone on torch's global generator, seeded with ``seed`` (None: not reseeded),
    and give the generator back as it was. ``devices``: the CUDA devices whose state to fork too."""
    import torch

    with _GLOBAL_RNG, torch.random.fork_rng(devices=list(devices)):
        if seed is not None:
            torch.manual_seed(seed)
        yield
