"""Whether this process hosts its workers itself, so that what they share stays in the process.

While a local executor is open (``executors/local.py``), channels created in this process get
in-process hosts and the rendezvous is this process's memory, even if Ray happens to be initialised
here: the workers are objects of this process and nothing of theirs should go through Ray.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_open = 0


def hosting() -> bool:
    """True while at least one in-process executor is open in this process."""
    return _open > 0


def enter() -> None:
    """Mark one more in-process executor open (pair with ``leave``)."""
    global _open
    with _lock:
        _open += 1


def leave() -> None:
    """Mark one in-process executor closed."""
    global _open
    with _lock:
        if _open == 0:
            raise RuntimeError("leave() without a matching enter()")
        _open -= 1


@contextmanager
def in_process() -> Iterator[None]:
    """``enter`` for the duration of a block."""
    enter()
    try:
        yield
    finally:
        leave()
