"""The frame of a run attempt every workflow shares: run directory, driver log, trace, executor, plan."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from m2flow.driver.stop import StopSignal
from m2flow.planner import Plan
from m2flow.runtime.cluster import Cluster, ClusterConfig
from m2flow.runtime.executors import Executor, make_executor
from m2flow.runtime.trace import ProcessInfo, configure_tracer, get_tracer, merge_traces, prepare_trace_dir, set_tracer

log = logging.getLogger(__name__)

class RunScaffold:
    """The parts of a run every workflow shares, as a context manager.

    On entry: the run directory, the driver's log file, the tracer when ``trace``. ``executor()``
    starts the executor of kind ``executor`` (``local`` or ``ray``: a Plan's, or the one its placement
    will give); ``adopt(plan)`` logs the plan and saves it as
    ``plan.json``. On exit: the executor is shut down and the trace merged; a failure while merging
    never replaces the run's own error.
    """

    def __init__(self, run_dir: str | Path, *, executor: str, cluster_config: ClusterConfig,
                 cluster: Cluster | None = None, trace: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.kind = executor
        self.cluster_config = cluster_config
        self.cluster = cluster
        self.trace = trace
        self.trace_dir: Path | None = None
        self._executor: Executor | None = None
        self.stop = StopSignal()

    def __enter__(self) -> RunScaffold:
        from m2flow.runtime.logs import setup_logging

        self.run_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(log_file=self.run_dir / "driver.log", console=False)
        if self.trace:
            self.trace_dir = prepare_trace_dir(self.run_dir)
            configure_tracer(self.trace_dir, ProcessInfo())
        return self

    def executor(self) -> Executor:
        """The run's executor, started on first use."""
        if self._executor is None:
            self._executor = make_executor(self.kind, self.cluster_config, self.cluster)
            self.stop.install()
        return self._executor

    def adopt(self, plan: Plan) -> Plan:
        """Log ``plan`` as a table and save it into the run directory."""
        log.info("%s", plan.table())
        plan.save(self.run_dir)
        return plan

    def __exit__(self, exc_type: type | None = None, exc: BaseException | None = None, tb: Any = None) -> None:
        try:
            if self._executor is not None:
                self._executor.shutdown()
                self._executor = None
        finally:
            self.stop.restore()
            if self.trace_dir is not None:
                self.trace_dir = None
                get_tracer().close()
                set_tracer(None)
                try:
                    merge_traces(self.run_dir)
                except Exception as e:  # noqa: BLE001 - the run's own error, if any, is the one to see
                    if exc is None:
                        raise
                    log.warning("trace not merged: %s", e)
