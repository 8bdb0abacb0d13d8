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


def seed_global_rngs(seed: int) -> None:
    """Seed torch's, numpy's and Python's global generators, so the state a checkpoint saves of them
    (``global_rng_state``) follows from the seed (a resumed run's checkpoint is byte-equal to the
    uninterrupted run's)."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def global_rng_state() -> dict[str, Any]:
    """The states of torch's (and CUDA's), numpy's and Python's global generators."""
    import random

    import numpy as np
    import torch

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``global_rng_state`` returned."""
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
