"""Calibrating what a message costs: the link's per-message latencies fitted so that the simulator
reproduces measured differences between probes.

A message's price cannot be read off one probe: a probe's iteration time also holds the driver's own
work (advantages, metrics), which no component's busy time shows. So the profiler runs the same batch
twice, with fewer and with more messages (fused and unfused, in the driver or across processes),
and the *difference* of the two measured iteration times is what the extra messages cost. The
latency is the least one under which the simulator predicts that same difference: the simulator
counts the messages of each plan itself (its edges, fan-in, pipeline stages and loop steps), so no
message count is restated here. The difference the simulator predicts never falls as the latency
grows (a plan with more messages pays at least as much for each), so a bisection finds it.

One cost of unfusing is no message: in the driver, model holders on separate rank threads run slower
(``CostModel.split_factor``), and every call in a Ray process (``process_factor``); ``busy_factor``
reads each off the probes' busy times, before the latencies are fitted with them in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from m2flow.planner.cost import CostModel, Link
from m2flow.planner.graph import WorkflowGraph
from m2flow.planner.setup import SimSetup, Workload
from m2flow.planner.simulate import Simulator

MAX_LATENCY_S = 1.0
"""A fitted latency never exceeds this (a pair whose difference no latency explains gets it)."""


@dataclass(frozen=True)
class Pair:
    """Two probes of the same batch that send different numbers of messages."""

    more: SimSetup
    """the plan sending more messages (unfused, or across processes)"""
    fewer: SimSetup
    extra_s: float
    """measured iteration seconds of ``more`` minus those of ``fewer``"""


def least_root(f: Callable[[float], float], target: float, hi: float = MAX_LATENCY_S, steps: int = 40) -> float:
    """The least ``x`` in [0, hi] with ``f(x) >= target``, for ``f`` nondecreasing: 0 when ``f(0)`` already
    reaches it, ``hi`` when ``f(hi)`` does not."""
    if f(0.0) >= target:
        return 0.0
    lo, x = 0.0, 1e-6
    while f(x) < target:
        lo, x = x, x * 4
        if x >= hi:
            if f(hi) < target:
                return hi
            x = hi
            break
    for _ in range(steps):
        mid = (lo + x) / 2
        if f(mid) >= target:
            x = mid
        else:
            lo = mid
    return x


def busy_factor(before: Mapping[str, float], after: Mapping[str, float], components: Sequence[str]) -> float:
    """The factor by which ``components``' busy seconds grew from one probe to another of the same batch
    (holders on one thread -> apart; the driver -> a Ray process). At least 1: noise never makes a plan
    faster; 1 when the probes did not both measure them."""
    names = [c for c in components if before.get(c, 0.0) > 0 and c in after]
    if not names:
        return 1.0
    return max(1.0, sum(after[c] for c in names) / sum(before[c] for c in names))


def _fit(graph: WorkflowGraph, workload: Workload, cost: CostModel, pair: Pair,
         with_value: Callable[[Link, float], Link]) -> float:
    def predicted_extra(value: float) -> float:
        sim = Simulator(graph, workload, replace(cost, link=with_value(cost.link, value)))
        return sim.simulate(pair.more).iteration_time - sim.simulate(pair.fewer).iteration_time

    return least_root(predicted_extra, pair.extra_s)


MAX_OVERSUBSCRIBED = 100.0
"""The largest oversubscription slowdown ``calibrate_oversubscribed`` fits."""


def calibrate_oversubscribed(graph: WorkflowGraph, workload: Workload, cost: CostModel, setup: SimSetup,
                             measured_s: float) -> float:
    """The ``CostModel.oversubscribed`` under which the simulator predicts ``measured_s`` for ``setup`` (a
    probe whose ranks' threads exceed the cores): the least such factor, at least 1."""
    def predicted(extra: float) -> float:
        return Simulator(graph, workload, replace(cost, oversubscribed=1.0 + extra)).simulate(setup).iteration_time

    return 1.0 + least_root(predicted, measured_s, hi=MAX_OVERSUBSCRIBED - 1.0)


def calibrate_link(graph: WorkflowGraph, workload: Workload, cost: CostModel, *, local: Pair | None = None,
                   remote: Pair | None = None, dispatch: Pair | None = None) -> Link:
    """``cost.link`` with its latencies fitted to the pairs given (the others kept):

    * ``local``: unfused against fused, both in the driver: ``local_latency``;
    * ``remote``: unfused against fused, both on Ray (the driver's calls are the same in both, so they
      cancel): ``latency``;
    * ``dispatch``: a Ray plan against the same plan in the driver: ``dispatch``, with the two
      latencies above already fitted.
    """
    link = cost.link
    if local is not None:
        link = replace(link, local_latency=_fit(graph, workload, replace(cost, link=link), local,
                                                lambda lk, v: replace(lk, local_latency=v)))
    if remote is not None:
        link = replace(link, latency=_fit(graph, workload, replace(cost, link=link), remote,
                                          lambda lk, v: replace(lk, latency=v)))
    if dispatch is not None:
        link = replace(link, dispatch=_fit(graph, workload, replace(cost, link=link), dispatch,
                                           lambda lk, v: replace(lk, dispatch=v)))
    return link
