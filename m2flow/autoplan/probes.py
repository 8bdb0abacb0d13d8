"""Profiling: what each component of a config costs on this machine, measured through the real workers.

A *probe* is a short run of the workflow itself (its own worker classes, loop and metrics) for
``iterations`` iterations at one batch size and one rank count. The first iteration warms up and
is not counted; of the others, the median of each component's busy-time metric (the slowest
rank's) is its time per iteration (a run's time is its typical iteration, which S1 measures too), which ``planner.measure`` turns into ``[items, devices,
seconds per call]`` points from the calls the probe's plan makes.

Which probes run:
- at one rank, every batch size the workflow lists (``Workflow.profile_probes``), with the
  ``local`` placement: one process, the components one after another (the fusions of
  every fusion key set, make one process run them in turn), each with its configured threads,
  which is what the cost model's contention rule assumes a measured time to be;
- on CPUs, when a component has more than one thread, the largest batch on one thread (how each
  component's time scales with its process's threads; every point records those threads);
- the largest batch again with nothing fused, in the driver: the extra messages between rank
  threads against the fused probe price a hand-off in the driver (the link's ``local_latency``);
- when the cluster has more than one device, the largest batch on Ray on device 0, fused (every
  component in one process) and unfused (a process each): unfused against fused prices a message
  between processes (``latency``), fused against the in-driver probe the driver's call to a
  process (``dispatch``). ``planner.calibrate`` fits each so that the simulator reproduces the
  measured difference;
- at 2, 4, ... ranks up to the cluster's devices (or ``max_devices``), the largest batch, every
  component on the first d devices under Ray; on CPUs with fewer threads per rank where d ranks'
  threads would not fit on the cores (and not at all below one thread each), so that no measured
  time already holds contention the simulator adds again; and once, the first such rank count at the
  configured threads (``oversubscribed``): ``planner.calibrate`` fits the slowdown beyond sharing the
  cores under which the simulator reproduces it.
The costs plans add are recorded beside: start-up (a probe's wall time outside its iterations,
split over its groups), model state (the bytes of the checkpoint the largest probe writes:
weights and training state), weight-sync bandwidth (from a multi-process probe's sync time,
where the workflow reports one), offload bandwidth (a copy of the state between device and
host; nothing moves on CPUs), bytes per item of each edge (the workflow's sizes), and each
probe's peak memory (the driver's resident peak, for local probes), and the CPU share of each component
that reports the CPU part of its busy time (``Component.cpu_timing``; the env workers, whose tool
latency is waiting): the median over the cost probes of that CPU time over its busy time.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from m2flow.autoplan.machine import device_memory, offload_bandwidth, on_gpus, peak_rss, reset_peak_rss
from m2flow.autoplan.plan_context import PlanContext
from m2flow.config import with_overrides

log = logging.getLogger(__name__)

Say = Callable[[str], None]
NOISY_SPREAD = 1.5
"""A component whose slowest measured iteration took this many times its fastest: the machine was busy."""
ITERATION_KEYS = ("time/step", "time/iteration_s")
"""Metrics holding an iteration's wall seconds (reasoning, embodied)."""


class ProfileWriteError(OSError):
    """The profile file cannot be written where asked."""


@dataclass
class Probe:
    """One profiling run: its settings and what it measured."""

    label: str
    overrides: dict[str, Any]
    placement: str
    ranks: int
    busy: dict[str, float] = field(default_factory=dict)
    """median busy seconds per iteration of each component over the measured iterations"""
    cpu: dict[str, float] = field(default_factory=dict)
    """median seconds per iteration each component's threads wanted a core, per rank (the components that
    report it)"""
    spread: dict[str, float] = field(default_factory=dict)
    """slowest / fastest measured iteration of each component (near 1 on a quiet machine)"""
    points: dict[str, tuple[float, int, float, int]] = field(default_factory=dict)
    """per component: (items, devices, seconds per call, threads of the process that ran it)"""
    startup_s: float = 0.0
    groups: int = 1
    sync_s: float | None = None
    peak_rss_bytes: int | None = None
    checkpoint: Path | None = None
    kind: str = "cost"
    """``cost``: its points fit the components; the others run the largest batch again to price messages
    (their points are not fitted): ``local`` unfused in the driver, ``dispatch`` fused in one Ray
    process, ``remote`` unfused in Ray processes; ``oversubscribed`` runs ranks whose threads exceed the
    cores"""
    iteration_s: float | None = None
    """median wall seconds of a measured iteration"""
    calls: int = 0
    """the driver's calls per iteration under its plan: one per running component"""
    setup: Any = None
    """the probe's plan as the simulator sees it (``planner.setup.SimSetup``)"""
    attempt: int = 0
    """which repeat of the probe this is (``Profiler.repeats``)"""


@contextmanager
def kept_logging() -> Iterator[None]:
    """Run a probe without losing this process's logging: a run sends the ``m2flow`` loggers to its
    own log file; afterwards the handlers from before come back."""
    logger = logging.getLogger("m2flow")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield
    finally:
        for h in list(logger.handlers):
            if h not in saved[0]:
                logger.removeHandler(h)
                h.close()
        for h in saved[0]:
            if h not in logger.handlers:
                logger.addHandler(h)
        logger.setLevel(saved[1])
        logger.propagate = saved[2]


def check_writable(path: Path) -> None:
    """Raise ProfileWriteError (one line) unless ``path`` can be written, before any probe runs."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProfileWriteError(f"cannot write the profile to {path}: {e.strerror or e}") from None
    if path.is_dir() or not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ProfileWriteError(f"cannot write the profile to {path}: "
                                f"{'it is a directory' if path.is_dir() else 'permission denied'}")


class Profiler:
    """Runs the probes of one config and writes its profile."""

    def __init__(self, ctx: PlanContext, *, iterations: int = 3, max_devices: int | None = None,
                 work_dir: Path, say: Say = log.info, repeats: int = 1) -> None:
        if iterations < 2:
            raise ValueError(f"profiling needs at least 2 iterations per run (one warm-up), got {iterations}")
        self.ctx, self.spec = ctx, ctx.spec
        self.thread_keys = ctx.spec.graph.thread_keys()
        # every fusion taken while profiling, so that each process runs one component at a time
        self.fusions = {key: True for key in ctx.spec.graph.fusion_keys().values()}
        if repeats < 1:
            raise ValueError(f"profiling needs at least 1 repeat, got {repeats}")
        self.iterations, self.max_devices, self.repeats = iterations, max_devices, repeats
        self.work_dir, self.say = Path(work_dir), say
        self.cores = None if on_gpus() else (os.cpu_count() or 1)

    # -- which probes --------------------------------------------------------------------------
    def probes(self) -> list[Probe]:
        sizes = self.spec.profile_probes(self.ctx.cfg)
        out = [Probe(f"b{i}", o, "local", 1) for i, o in enumerate(sizes)]
        out[-1].overrides = {**out[-1].overrides, "checkpoint_every": self.iterations}
        limit = min(self.ctx.devices, self.max_devices or self.ctx.devices)
        threads = max(self.ctx.space.threads.values(), default=1)
        if self.cores is not None and threads > 1 and self.thread_keys:
            # The largest batch again on one thread: how each component's time scales with its
            # process's threads, for ranks that run with fewer threads than the probes' process.
            one = {key: 1 for c, key in self.thread_keys.items() if c in self.ctx.space.threads}
            out.append(Probe("t1", {**sizes[-1], **one}, "local", 1))
        names = ",".join(self.ctx.spec.graph.component_names)
        unfused = {k: not v for k, v in self.fusions.items()}
        if unfused:
            out.append(Probe("u1", {**sizes[-1], **unfused}, "local", 1, kind="local"))
        d = 2
        over: list[Probe] = []
        while d <= limit:
            fewer: dict[str, int] = {}
            if self.cores is not None and d * threads > self.cores:
                # Fewer threads per rank so that the ranks fit on the cores (the fit carries the point
                # over to the configured threads); without thread keys, or below one thread, stop here.
                per_rank = self.cores // d
                if per_rank < 1 or not self.thread_keys:
                    self.say(f"profile: not probing {d} ranks: {d} x {threads} thread(s) exceed the "
                             f"{self.cores} core(s), and a measured time must hold no contention")
                    break
                fewer = {key: per_rank for c, key in self.thread_keys.items() if c in self.ctx.space.threads}
                self.say(f"profile: probing {d} ranks at {per_rank} thread(s) each, so that they fit on the "
                         f"{self.cores} core(s)")
                if not over:
                    # The same ranks at their configured threads, once: how much slower than sharing
                    # the cores a plan runs whose threads exceed them (its points are not fitted).
                    over = [Probe(f"o{d}", dict(sizes[-1]), f"{names}: 0-{d - 1}", d, kind="oversubscribed")]
            out.append(Probe(f"d{d}", {**sizes[-1], **fewer}, f"{names}: 0-{d - 1}", d))
            d *= 2
        out += over
        if self.ctx.devices > 1:
            # The largest batch again, every component in one Ray process on device 0: what a call to
            # another process adds (plans over more than one device run on Ray; one device, in the driver).
            out.append(Probe("r1", dict(sizes[-1]), f"{names}: 0", 1, kind="dispatch"))
            if unfused:
                out.append(Probe("m1", {**sizes[-1], **unfused}, f"{names}: 0", 1, kind="remote"))
        return out

    # -- running one ---------------------------------------------------------------------------
    def run_probe(self, probe: Probe, cluster: Any = None) -> Probe:
        from m2flow.planner.measure import call_shapes, points
        from m2flow.planner.setup import setup_from_plan

        from m2flow.driver.run import attempts

        spec = self.spec
        cfg = self.ctx.configure({**self.fusions, **probe.overrides, "placement": probe.placement})
        run_dir = self.work_dir / (probe.label if not probe.attempt else f"{probe.label}.{probe.attempt}")
        cfg = with_overrides(spec.schema, cfg, {
            **spec.profile_length(cfg, self.iterations), "run_dir": str(run_dir), "resume": None, "trace": False,
            "metrics.sinks": ["jsonl"], "fault_tolerance.max_restarts": 0,
            "checkpoint_every": probe.overrides.get("checkpoint_every", 0)})
        plan = spec.plan(cfg, self.ctx.layout)
        reset_peak_rss()
        start = time.perf_counter()
        with kept_logging():
            result = attempts(spec, cfg, cluster)(0)  # one attempt: a probe never restarts
        wall = time.perf_counter() - start
        history = result.history
        if len(history) < 2:
            raise RuntimeError(f"profile run {probe.label} ran {len(history)} iteration(s); it needs 2 or more")
        measured = history[1:]
        # The median of the measured iterations: a run's time is that of its typical iteration, and a
        # probe has its threads to itself (contention between processes is added by the simulator). The
        # least would be the time of an iteration that met no interruption, which a whole run never
        # keeps to (it made every prediction fast). The spread says how busy the machine was.
        seen = {c: [h[key] for h in measured if key in h] for c, key in spec.graph.timings().items()
                if c in self.ctx.space.running}
        probe.busy = {c: statistics.median(v) for c, v in seen.items() if v}
        probe.spread = {c: max(v) / min(v) for c, v in seen.items() if v and min(v) > 0}
        cpu = {c: [h[key] for h in measured if key in h] for c, key in spec.graph.cpu_timings().items() if c in probe.busy}
        probe.cpu = {c: statistics.median(v) for c, v in cpu.items() if v}
        setup = probe.setup = setup_from_plan(plan, self.ctx.space.holders)
        # Each point carries the threads of the process that measured it (a fused component's are its
        # host's; the local executor's one process takes the most any component asks).
        shapes = call_shapes(spec.graph, self.ctx.space.workload, setup)
        probe.points = {c: (*pt, setup.components[c].threads) for c, pt in points(shapes, probe.busy).items()}
        probe.calls = sum(1 for c, shape in shapes.items() if c in self.ctx.space.running and shape.calls)
        steps = [sum(h.get(k, 0.0) for k in ITERATION_KEYS) for h in measured]
        probe.iteration_s = statistics.median(steps) if steps and min(steps) > 0 else None
        loop = sum(h.get(k, 0.0) for h in history for k in ITERATION_KEYS)
        probe.groups = max(1, len(plan.launched))
        probe.startup_s = max(0.0, wall - loop)
        syncs = [h["time/weight_sync_s"] for h in measured if h.get("time/weight_sync_s", 0) > 0]
        probe.sync_s = statistics.median(syncs) if syncs and probe.placement != "local" else None
        probe.peak_rss_bytes = peak_rss() if probe.placement == "local" else None
        done = sorted((run_dir / "checkpoints").glob("step_*"))
        probe.checkpoint = done[-1] if done else None
        return probe

    # -- the whole profile ---------------------------------------------------------------------
    def run(self, out: Path) -> dict[str, Any]:
        """Run every probe, fit, and write the profile to ``out``; returns the profile."""
        from m2flow.planner.cost import fit_component
        from m2flow.planner.profile_file import new_profile

        check_writable(out)
        probes = self.probes()
        cluster = None
        runs: dict[str, list[Probe]] = {}
        try:
            for attempt in range(self.repeats):
                for i, planned in enumerate(probes, start=1):
                    probe = replace(planned, overrides=dict(planned.overrides), attempt=attempt)
                    what = ", ".join(f"{k}={v}" for k, v in probe.overrides.items() if k != "checkpoint_every")
                    again = f", repeat {attempt + 1}/{self.repeats}" if self.repeats > 1 else ""
                    self.say(f"profile {i}/{len(probes)}{again}: {probe.ranks} rank(s), {what} "
                             f"({self.iterations} iterations)")
                    if probe.placement != "local" and cluster is None:
                        from m2flow.runtime.cluster import Cluster

                        cluster = Cluster(self.ctx.cfg.cluster)
                    t0 = time.perf_counter()
                    self.run_probe(probe, cluster)
                    times = ", ".join(f"{c} {t * 1e3:.1f} ms" for c, t in probe.busy.items())
                    self.say(f"  {time.perf_counter() - t0:.1f}s; busy per iteration: {times}")
                    noisy = {c: r for c, r in probe.spread.items() if r > NOISY_SPREAD}
                    if noisy:
                        self.say("  the machine looks busy: " + ", ".join(f"{c} varied {r:.1f}x" for c, r in
                                                                        noisy.items())
                                 + " between iterations (the median counts; profile on a quiet machine for a "
                                 "closer fit)")
                    runs.setdefault(probe.label, []).append(probe)
        finally:
            if cluster is not None:
                cluster.shutdown()
        # Of a probe's repeats, the one whose iterations ran fastest: a slow spell of the machine (they
        # last seconds) lengthens a whole run, and repeating in rotation lets one run miss it.
        done = [min(tries, key=lambda p: p.iteration_s if p.iteration_s is not None else math.inf)
                for tries in runs.values()]
        weights, training = self.spec.model_bytes(next((p.checkpoint for p in done if p.checkpoint), None))
        comps: dict[str, dict[str, Any]] = {}
        holders = set(self.ctx.space.holders)
        trainers = {c.name for c in self.ctx.spec.graph.components if c.trains}
        startup = min(p.startup_s / p.groups for p in done)
        # The curves are those of the driver: a point measured in Ray processes is divided by how much
        # slower the same batch ran there (the dispatch probe against the in-driver one).
        process = self._process_factor(done)
        for c in self.ctx.space.running:
            pts = [[p.points[c][0], p.points[c][1], p.points[c][2] / (process if p.placement != "local" else 1.0),
                    p.points[c][3]] for p in done if c in p.points and p.kind == "cost"]
            if not pts:
                raise RuntimeError(f"profile: no run measured {c!r} (metric {self.spec.graph.timings().get(c)!r})")
            state = (training if c in trainers else weights) if c in holders else 0.0
            entry = {"points": pts, "mem_fixed": state + (weights if c in trainers else 0.0), "mem_per_item": 0.0,
                     "state_bytes": state, "startup_s": startup}
            if c in holders:  # the model's weights: what a trainer's sync sends, what a fused copy shares
                entry["weight_bytes"] = weights
            share = cpu_share(c, [p for p in done if p.kind == "cost"])
            if share is not None:
                entry["cpu_share"] = share
                self.say(f"profile: {c} computes {share:.0%} of its busy time (the rest waits)")
            entry["fit_error"] = fit_component([tuple(p) for p in pts]).error
            comps[c] = entry
        profile = new_profile(
            self.ctx.spec.name, self.ctx.config_hash(), comps,
            device={"memory_bytes": device_memory(), "cores": self.cores}, link={},
            offload_bandwidth=offload_bandwidth(training), edge_bytes=self.spec.edge_bytes(self.ctx.cfg),
            probes=[{"label": p.label, "ranks": p.ranks, "overrides": {k: v for k, v in p.overrides.items()},
                     "kind": p.kind, "iteration_s": p.iteration_s, "calls": p.calls, "busy_s": p.busy,
                     "cpu_s": p.cpu, "spread": p.spread, "startup_s": p.startup_s, "peak_rss_bytes": p.peak_rss_bytes,
                     "repeats_s": [q.iteration_s for q in runs[p.label]]}
                    for p in done])
        profile["driver_split"] = self._driver_split(done)
        profile["process_factor"] = process
        profile["link"] = self._link(done, weights, profile)
        profile["oversubscribed"] = self._oversubscribed(done, profile)
        if profile["oversubscribed"] != 1.0:
            self.say(f"profile: ranks whose threads exceed the cores run {profile['oversubscribed']:.1f}x slower "
                     "than sharing the cores alone")
        if process != 1.0:
            self.say(f"profile: components in Ray processes run {process:.2f}x as long as in the driver")
        if profile["driver_split"]["factor"] != 1.0:
            self.say(f"profile: model holders on separate rank threads of the driver run "
                     f"{profile['driver_split']['factor']:.2f}x as long")
        self.say("profile: a message costs " + ", ".join(
            f"{k} {profile['link'][k] * 1e3:.3f} ms" for k in ("local_latency", "latency", "dispatch")
            if profile["link"].get(k) is not None))
        try:
            out.write_text(json.dumps(profile, indent=1, default=str))
        except OSError as e:
            raise ProfileWriteError(f"cannot write the profile to {out}: {e.strerror or e}") from None
        return profile

    def _link(self, probes: list[Probe], weights: float, profile: dict[str, Any]) -> dict[str, Any]:
        """The link: bandwidth from the weight syncs, latencies calibrated on the message probes."""
        from m2flow.planner.calibrate import calibrate_link
        from m2flow.planner.cost import Link
        from m2flow.planner.profile_file import cost_model

        measured = []
        bandwidth = 1e9
        syncs = [p.sync_s for p in probes if p.sync_s]
        if syncs and weights > 0:
            bandwidth = weights / max(min(syncs), 1e-6)
            measured.append("weight sync")
        by_kind = self._by_kind(probes)
        base = self._fused_base(probes)
        pairs = {"local": _pair(by_kind.get("local"), base),
                 "remote": _pair(by_kind.get("remote"), by_kind.get("dispatch")),
                 "dispatch": _pair(by_kind.get("dispatch"), base)}
        cost = cost_model({**profile, "link": {"bandwidth": bandwidth, "latency": 1e-4}})
        link = calibrate_link(self.ctx.spec.graph, self.ctx.space.workload, cost, **pairs)
        measured += [what for what, p in pairs.items() if p is not None]
        if pairs["remote"] is None and pairs["dispatch"] is not None:
            link = Link(link.bandwidth, link.dispatch or 1e-4, link.local_latency, link.dispatch)
        return {"bandwidth": link.bandwidth, "latency": link.latency, "local_latency": link.local_latency,
                "dispatch": link.dispatch, "measured": " and ".join(measured) or False}


    @staticmethod
    def _by_kind(probes: list[Probe]) -> dict[str, Probe]:
        return {p.kind: p for p in probes if p.kind != "cost" and p.iteration_s is not None}

    def _fused_base(self, probes: list[Probe]) -> Probe | None:
        """The in-driver cost probe of the message probes' batch (the fastest, when several ran it)."""
        by_kind = self._by_kind(probes)
        batch = _batch(by_kind.get("dispatch", by_kind.get("local")))
        fused = [p for p in probes if p.kind == "cost" and p.placement == "local" and p.iteration_s is not None
                 and batch is not None and _batch(p) == batch]
        return min(fused, key=lambda p: p.iteration_s or 0.0) if fused else None

    def _oversubscribed(self, probes: list[Probe], profile: dict[str, Any]) -> float:
        """The oversubscription slowdown under which the simulator reproduces the oversubscribed probe
        (1 without one)."""
        from m2flow.planner.calibrate import calibrate_oversubscribed
        from m2flow.planner.profile_file import cost_model

        probe = self._by_kind(probes).get("oversubscribed")
        if probe is None or probe.iteration_s is None:
            return 1.0
        return calibrate_oversubscribed(self.ctx.spec.graph, self.ctx.space.workload, cost_model(profile),
                                        probe.setup, probe.iteration_s)

    def _process_factor(self, probes: list[Probe]) -> float:
        """How much longer the components' busy time is in Ray processes than in the driver: the dispatch
        probe against the in-driver probe of its batch (1 without both)."""
        from m2flow.planner.calibrate import busy_factor

        ray, base = self._by_kind(probes).get("dispatch"), self._fused_base(probes)
        if ray is None or base is None:
            return 1.0
        return busy_factor(base.busy, ray.busy, list(self.ctx.space.running))

    def _driver_split(self, probes: list[Probe]) -> dict[str, Any]:
        """How much longer the model holders take on separate rank threads of the driver: their busy time in
        the unfused in-driver probe over the fused one's, when only the first has them apart (1 otherwise:
        the fitted curves already hold it, or nothing measured it)."""
        from m2flow.planner.calibrate import busy_factor
        from m2flow.planner.cost import apart

        holders = list(self.ctx.space.holders)
        unfused, base = self._by_kind(probes).get("local"), self._fused_base(probes)
        factor = 1.0
        if unfused is not None and base is not None:
            def split(p: Probe) -> bool:
                return apart({c: q.host for c, q in p.setup.components.items()}, holders)

            if split(unfused) and not split(base):
                factor = busy_factor(base.busy, unfused.busy, holders)
        return {"factor": factor, "components": holders}


def _batch(p: Probe | None) -> dict[str, Any] | None:
    """A probe's batch: its overrides but the fusions and the checkpoint interval."""
    if p is None:
        return None
    return {k: v for k, v in p.overrides.items() if k != "checkpoint_every" and ".fuse_with_" not in k}


def _pair(more: Probe | None, fewer: Probe | None) -> Any:
    """The calibration pair of two probes of the same batch (None unless both ran and timed an iteration)."""
    from m2flow.planner.calibrate import Pair

    if more is None or fewer is None or more.iteration_s is None or fewer.iteration_s is None:
        return None
    return Pair(more.setup, fewer.setup, more.iteration_s - fewer.iteration_s)


def cpu_share(component: str, probes: list[Probe]) -> float | None:
    """The part of ``component``'s busy time its threads wanted a core: the median over ``probes`` of its CPU
    seconds over its busy seconds, in [0, 1] (None when no probe measured its CPU)."""
    shares = [min(1.0, p.cpu[component] / p.busy[component]) for p in probes
              if component in p.cpu and p.busy.get(component, 0.0) > 0]
    return round(statistics.median(shares), 4) if shares else None


def fit_errors(profile: dict[str, Any]) -> dict[str, float]:
    """The relative RMS error of each component's fit, from a profile this module wrote."""
    return {c: float(e.get("fit_error", math.nan)) for c, e in profile["components"].items()}
