"""Shared fixtures: one local Ray session for the whole test run (start-up costs seconds)."""

from __future__ import annotations

import inspect
import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _calls_shared_cluster(fn) -> bool:
    try:
        return "shared_cluster(" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


def _uses_ray(item) -> bool:
    """A test that starts Ray worker processes: it takes the shared cluster, or its module does, or it or
    one of its fixtures calls ``shared_cluster()`` (a module-scoped fixture's runs count for every user)."""
    module = getattr(item, "module", None)
    if "cluster" in getattr(item, "fixturenames", ()) or getattr(module, "shared_cluster", None) is not None:
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    functions = [getattr(item, "function", None)] + [d.func for chain in defs for d in chain]
    return any(_calls_shared_cluster(f) for f in functions if f is not None)


def pytest_collection_modifyitems(config, items):
    for item in items:  # so that `-m "not ray"` is the quick in-process subset
        if _uses_ray(item):
            item.add_marker(pytest.mark.ray)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cluster():
    """The shared local Ray cluster (see ``tests/ray_session.py``)."""
    from tests.ray_session import shared_cluster

    return shared_cluster()


def pytest_sessionfinish(session, exitstatus):
    """Stop the shared Ray session while the test process is whole: its pooled rank processes are killed and
    every thread waiting on them has returned before Ray's own exit hook runs."""
    import sys

    session.config._m2flow_exitstatus = exitstatus
    ray_session = sys.modules.get("tests.ray_session")
    if ray_session is not None:  # a test used Ray
        ray_session.stop_ray()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process once pytest has reported: the exit hooks run (Ray's, the channels', the sandbox
    pool's, each at its registered place), then the process exits with pytest's status without tearing down
    the interpreter's modules one by one. That teardown unloads Ray's core worker, torch, gloo and MuJoCo's
    renderer in no fixed order; a crash there once failed a run whose every test had passed (exit 139 after
    the report). A crash during a test, or in an exit hook, still fails the run, its stacks printed by
    ``PYTHONFAULTHANDLER`` in ``make test``."""
    import atexit
    import sys

    status = getattr(config, "_m2flow_exitstatus", None)
    if status is None:
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(status))
