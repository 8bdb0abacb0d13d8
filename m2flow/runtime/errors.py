"""Exceptions that carry where a failure happened: group, rank, node, and the worker's traceback."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """A worker method raised; carries the group, rank, node and the worker's own traceback."""

    def __init__(
        self,
        group: str,
        rank: int,
        node: str,
        message: str,
        remote_traceback: str = "",
        exc_type: str = "",
        exc_classes: tuple[str, ...] = (),
    ) -> None:
        self.group = group
        self.rank = rank
        self.node = node
        self.message = message
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type
        self.exc_classes = tuple(exc_classes)
        """Dotted names (``module.Class``) of every class of the worker's exception, its own first: lets the
        caller tell what kind of failure it was without importing the worker's modules."""
        super().__init__(self._render())

    def raised(self, *dotted_names: str) -> bool:
        """Whether the worker's exception was an instance of one of the classes named ``module.Class``."""
        return any(name in self.exc_classes for name in dotted_names)

    def _what(self) -> str:
        return f"raised {self.exc_type}: {self.message}" if self.exc_type else self.message

    def _render(self) -> str:
        head = f"worker {self.group}[rank {self.rank}] on node {self.node} {self._what()}"
        if self.remote_traceback:
            return f"{head}\n--- traceback in the worker ---\n{self.remote_traceback.rstrip()}"
        return head

    def __reduce__(self):  # keep the fields when the error crosses processes
        return (
            type(self),
            (self.group, self.rank, self.node, self.message, self.remote_traceback, self.exc_type,
             self.exc_classes),
        )


class WorkerDiedError(WorkerError):
    """A worker process died (killed, out of memory, crashed) while the caller waited on it."""

    def _what(self) -> str:
        return f"died: {self.message}"


class WorkerHungError(WorkerDiedError):
    """A worker gave no result within its deadline; it is treated as dead (its group is restarted)."""

    def _what(self) -> str:
        return f"hung: {self.message}"


class RunHealthError(RuntimeError):
    """The run's own data went bad past a configured limit (failed reward checks, non-finite losses in a
    row, environments that raise); the message names the limit, and the run stops without a restart."""


def class_names(exc: BaseException) -> tuple[str, ...]:
    """Dotted names of the classes of ``exc`` (its method resolution order, ``object`` left out)."""
    return tuple(f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__ if c is not object)


def health_stop(error: BaseException) -> bool:
    """Whether ``error`` is a ``RunHealthError``, raised here or in a worker (then wrapped in a
    ``WorkerError``)."""
    if isinstance(error, RunHealthError):
        return True
    return isinstance(error, WorkerError) and error.exc_type == RunHealthError.__name__


_DEATHS = {"WorkerDiedError", "WorkerHungError", "PeerDiedError"}


def worker_died(error: BaseException) -> bool:
    """Whether ``error`` means a worker process is gone or stuck, whichever side noticed it: the
    caller waiting on the dead worker (``WorkerDiedError``), or a worker whose peer died mid-message
    (a ``WorkerError`` raised from ``PeerDiedError``)."""
    if isinstance(error, WorkerDiedError):
        return True
    return isinstance(error, WorkerError) and error.exc_type in _DEATHS
