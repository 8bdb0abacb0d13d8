"""Logging set-up for the driver and for workers: one file per worker, console on rank 0 only."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_HANDLER_TAG = "_m2flow_handler"


def setup_logging(
    level: int | str = logging.INFO,
    log_file: str | Path | None = None,
    console: bool = True,
    prefix: str = "",
) -> None:
    """Route the ``m2flow`` loggers to ``log_file`` and, when ``console``, to stderr.

    Idempotent: handlers added by an earlier call are replaced, so a worker or a test can call it again.
    """
    logger = logging.getLogger("m2flow")
    logger.setLevel(level)
    logger.propagate = False
    for h in list(logger.handlers):
        if getattr(h, _HANDLER_TAG, False):
            logger.removeHandler(h)
            h.close()
    fmt = logging.Formatter(f"{prefix}{_FORMAT}" if prefix else _FORMAT, datefmt="%H:%M:%S")
    handlers: list[logging.Handler] = []
    if log_file is not None:
        path = Path(log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path))
    if console:
        handlers.append(logging.StreamHandler(sys.stderr))
    for h in handlers:
        setattr(h, _HANDLER_TAG, True)
        h.setFormatter(fmt)
        logger.addHandler(h)
