"""What every rank host does, whatever hosts it (a Ray actor process, or a thread of the driver for
the local executor): build the worker with its identity set first, run a method under a trace span,
and hand a failure back as a value that names the rank."""

from __future__ import annotations

import traceback
from typing import Any

from m2flow.runtime.errors import WorkerError, class_names
from m2flow.runtime.handle import CallFailure
from m2flow.runtime.hosting import split_method
from m2flow.runtime.trace import category_of, get_tracer
from m2flow.runtime.worker import Worker, WorkerContext


def failure(ctx: WorkerContext, exc: BaseException) -> CallFailure:
    """``exc`` (being handled) as the value a rank returns: group, rank, node and its traceback."""
    return CallFailure(WorkerError(ctx.group_name, ctx.rank, f"{ctx.node_rank} ({ctx.node_ip})", str(exc),
                                   traceback.format_exc(), type(exc).__name__,
                                   class_names(exc)))


def build_worker(cls: type[Worker], ctx: WorkerContext, args: tuple, kwargs: dict) -> Worker:
    """An instance of ``cls`` whose identity is known before the subclass ``__init__`` runs."""
    worker = cls.__new__(cls)
    worker._m2flow_ctx = ctx
    worker.__init__(*args, **kwargs)
    # Listen from the start: a peer may send before this rank first touches comm.
    worker.comm  # noqa: B018
    return worker


def run_method(worker: Worker | None, method: str, args: tuple, kwargs: dict) -> Any:
    """``worker.method(*args, **kwargs)`` inside one trace span (a disabled tracer makes it a no-op);
    ``"component/method"`` calls the method of a component hosted by the worker (``Worker.host``)."""
    if worker is None:
        raise RuntimeError("the worker was not constructed")
    component, name = split_method(method)
    target: Any = worker
    if component:
        target = worker.hosted(component)
        if target is None:
            raise RuntimeError(f"{type(worker).__name__} hosts no component {component!r} (called {method!r})")
    fn = getattr(target, name)
    with get_tracer().span(name, cat=category_of(fn, name)):
        return fn(*args, **kwargs)
