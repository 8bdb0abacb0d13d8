"""Calibrating a message's price: the latency under which the simulator reproduces a measured difference."""

from __future__ import annotations

from dataclasses import replace

import pytest

from m2flow.planner import Component, Edge, WorkflowGraph
from m2flow.planner.calibrate import (MAX_LATENCY_S, Pair, calibrate_link, calibrate_oversubscribed, least_root,
                                      busy_factor)
from m2flow.planner.cost import ComponentCost, CostModel, Link
from m2flow.planner.setup import Workload, build_setup
from m2flow.planner.simulate import Simulator

GRAPH = WorkflowGraph("loop", (Component("env", "steps"), Component("policy", "acts"), Component("train", "trains")),
                      (Edge("obs", "env", "policy", "Obs"), Edge("actions", "policy", "env", "Action"),
                       Edge("batch", "env", "train", "Batch")))
WORK = Workload(chain=("train",), items=("envs", "steps"), loop=("env", "policy"), loop_steps="steps",
                loop_items=("envs",), stages="stages",
                inputs={"env": ("actions",), "policy": ("obs",), "train": ("batch",)})
SETTINGS = {"envs": 8, "steps": 16, "stages": 2}


def _cost(link: Link) -> CostModel:
    return CostModel({"env": ComponentCost(a=0.002, c=0.0001), "policy": ComponentCost(a=0.001, c=0.0002),
                      "train": ComponentCost(a=0.05)}, link=link)


def _setups():
    """The probes' plans: fused and unfused, in the driver and on Ray (one device each way)."""
    fused = build_setup([(("env", "policy"), 0, 1), (("train",), 0, 1)], {"policy": "env"}, SETTINGS)
    unfused = build_setup([(("env",), 0, 1), (("policy",), 0, 1), (("train",), 0, 1)], {}, SETTINGS)
    assert fused.in_driver and unfused.in_driver
    return fused, unfused, replace(fused, in_driver=False), replace(unfused, in_driver=False)


def test_least_root_finds_the_least_value_reaching_the_target():
    assert least_root(lambda x: 1 + 2 * x, 3.0) == pytest.approx(1.0)
    assert least_root(lambda x: 1 + 2 * x, 0.5) == 0.0  # already there: no latency
    assert least_root(lambda x: 1 + 1e-9 * x, 3.0) == MAX_LATENCY_S  # never there: the cap
    steps = least_root(lambda x: float(int(x * 1000)), 3.0)  # a staircase: its first step at the target
    assert steps == pytest.approx(0.003, abs=1e-9)


def test_the_latencies_that_made_the_measurements_are_recovered():
    true = Link(latency=0.0007, local_latency=0.0003, dispatch=0.004)
    fused, unfused, ray_fused, ray_unfused = _setups()
    sim = Simulator(GRAPH, WORK, _cost(true))
    t = {name: sim.simulate(s).iteration_time for name, s in
         (("fused", fused), ("unfused", unfused), ("ray_fused", ray_fused), ("ray_unfused", ray_unfused))}
    # Unfused, env and policy overlap across the two stages (their own threads) but pay two messages per
    # step and stage: the difference holds both, and only the latency that made it reproduces it.
    link = calibrate_link(GRAPH, WORK, _cost(Link()),
                          local=Pair(unfused, fused, t["unfused"] - t["fused"]),
                          remote=Pair(ray_unfused, ray_fused, t["ray_unfused"] - t["ray_fused"]),
                          dispatch=Pair(ray_fused, fused, t["ray_fused"] - t["fused"]))
    assert link.local_latency == pytest.approx(true.local_latency, rel=1e-6)
    assert link.latency == pytest.approx(true.latency, rel=1e-6)
    assert link.dispatch == pytest.approx(true.dispatch, rel=1e-6)


def test_noise_that_makes_more_messages_look_cheaper_gives_no_latency_not_a_negative_one():
    fused, unfused, *_ = _setups()
    link = calibrate_link(GRAPH, WORK, _cost(Link(local_latency=0.5)), local=Pair(unfused, fused, -1.0))
    assert link.local_latency == 0.0
    assert calibrate_link(GRAPH, WORK, _cost(Link(latency=0.25))).latency == 0.25  # no pair: kept


def test_holders_apart_in_the_driver_slow_by_the_busy_time_they_gained():
    assert busy_factor({"gen": 0.03, "train": 0.04, "reward": 0.001}, {"gen": 0.07, "train": 0.07, "reward": 0.5},
                        ["gen", "train"]) == pytest.approx(0.14 / 0.07)  # reward holds no model: not counted
    assert busy_factor({"gen": 0.05}, {"gen": 0.04}, ["gen"]) == 1.0  # noise never makes a plan faster
    assert busy_factor({}, {"gen": 0.04}, ["gen"]) == 1.0  # nothing measured it


def test_the_split_factor_slows_only_holders_apart_in_the_driver():
    cost = replace(_cost(Link(latency=0.0)), split_factor=2.0, split_components=frozenset({"policy", "train"}))
    sim, plain = Simulator(GRAPH, WORK, cost), Simulator(GRAPH, WORK, _cost(Link(latency=0.0)))
    fused, unfused, ray_fused, ray_unfused = _setups()
    # Fused, policy and train are on two rank threads already (train is apart): both plans pay it.
    for setup in (fused, unfused):
        assert sim._call(setup, "policy", 4) == pytest.approx(2 * plain._call(setup, "policy", 4))
        assert sim._call(setup, "env", 4) == pytest.approx(plain._call(setup, "env", 4))  # holds no model
    together = build_setup([(("env", "policy", "train"), 0, 1)], {"policy": "env", "train": "env"}, SETTINGS)
    assert sim._call(together, "train", 4) == pytest.approx(plain._call(together, "train", 4))
    # Ray processes keep a thread team each: no factor.
    assert sim._call(ray_unfused, "train", 4) == pytest.approx(plain._call(ray_unfused, "train", 4))


def test_calls_in_ray_processes_take_the_process_factor():
    cost = replace(_cost(Link(latency=0.0)), process_factor=1.5)
    sim, plain = Simulator(GRAPH, WORK, cost), Simulator(GRAPH, WORK, _cost(Link(latency=0.0)))
    fused, _, ray_fused, _ = _setups()
    assert sim._call(ray_fused, "train", 4) == pytest.approx(1.5 * plain._call(ray_fused, "train", 4))
    assert sim._call(fused, "train", 4) == pytest.approx(plain._call(fused, "train", 4))  # the driver's own


def test_the_oversubscription_slowdown_that_made_a_measurement_is_recovered():
    cost = replace(_cost(Link(latency=0.0)), cores=2)
    # Env and policy in their own processes, two threads each, on two cores: while both run they want 4.
    apart = replace(build_setup([(("env",), 0, 1), (("policy",), 1, 1), (("train",), 0, 2)], {}, SETTINGS,
                                threads={"env": 2, "policy": 2, "train": 1}, devices_per_node=2), in_driver=False)
    measured = Simulator(GRAPH, WORK, replace(cost, oversubscribed=4.0)).simulate(apart).iteration_time
    assert calibrate_oversubscribed(GRAPH, WORK, cost, apart, measured) == pytest.approx(4.0, rel=1e-6)
    # A measurement sharing alone explains needs no slowdown.
    plain = Simulator(GRAPH, WORK, cost).simulate(apart).iteration_time
    assert calibrate_oversubscribed(GRAPH, WORK, cost, apart, plain * 0.9) == 1.0
