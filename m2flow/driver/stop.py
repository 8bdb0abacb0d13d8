"""SIGTERM as a clean stop: the run ends after the iteration it is in, checkpointed, with exit code 143.

Light on purpose (no torch, no Ray): the command line imports it for every command.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)

EXIT_TERMINATED = 143
"""The exit code of a run stopped by SIGTERM (128 + 15), as a shell reports it."""


class Terminated(Exception):
    """A second SIGTERM arrived while the run was already stopping: stop at once."""


class StopSignal:
    """SIGTERM (a job scheduler's stop) as a request to stop cleanly.

    The first one sets ``requested``: the loop ends the iteration it is in, saves a checkpoint when
    checkpoints are configured, and the run returns ``EXIT_TERMINATED``. A second one raises
    ``Terminated`` where the driver is, and the run's context managers shut everything down.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """Take over SIGTERM (only the main thread may); call it after Ray started, whose own handler
        would otherwise dump a stack and abort."""
        if threading.current_thread() is threading.main_thread() and not self._installed:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise Terminated("SIGTERM again: stopping now")
        self.requested = True
        log.warning("SIGTERM: stopping after this iteration (a second SIGTERM stops at once)")

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def __call__(self) -> bool:
        return self.requested


__all__ = ["EXIT_TERMINATED", "StopSignal", "Terminated"]
