"""Helpers for tests that watch processes from outside."""

from __future__ import annotations

import time
from pathlib import Path


def process_gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False
