"""Memory per device of a fused model copy: only its weights are its host's; the rest of its fixed bytes count."""

from __future__ import annotations

from dataclasses import replace

from m2flow.planner import Component, Edge, Fusion, WorkflowGraph
from m2flow.planner.cost import ComponentCost, CostModel, Link
from m2flow.planner.memory import MemoryCheck
from m2flow.planner.search import MEMORY, SearchSpace, Searcher, search
from m2flow.planner.setup import Workload, build_setup

GIB = 2.0 ** 30
GRAPH = WorkflowGraph("mem", (Component("gen", "generates", holds_model=True),
                              Component("train", "trains", holds_model=True)),
                      (Edge("items", "gen", "train", "Item"), Edge("weights", "train", "gen", "w", kind="weights")),
                      (Fusion("gen", "train", "same devices"),))
WORK = Workload(chain=("gen", "train"), items=("batch",), micro_items=("micro",), inputs={"train": ("items",)},
                weights=(("train", "gen"),))
SPACE = SearchSpace(GRAPH, WORK, ("gen", "train"), {"batch": 8, "micro": 8}, fusions=(("gen", "train"),))


def profile(gen_weights: float) -> CostModel:
    """A generator of 40 GiB fixed memory (1 GiB of it weights, the rest a cache pool) beside a trainer of
    70 GiB, on 80 GiB devices; offloading is slow, so taking turns on shared devices costs much."""
    return CostModel({"gen": ComponentCost(0.1, 1.0, 1.0, mem_fixed=40 * GIB, state_bytes=40 * GIB,
                                           weight_bytes=gen_weights),
                      "train": ComponentCost(0.1, 1.0, 1.0, mem_fixed=70 * GIB, state_bytes=70 * GIB,
                                             weight_bytes=1 * GIB)},
                     edge_bytes={"items": 1e6}, link=Link(bandwidth=1e9, latency=1e-4), offload_bandwidth=1e9,
                     device_memory=80 * GIB)


def fused_collocated(devices: int = 4):
    return build_setup([(("gen", "train"), 0, devices)], {"gen": "train", "train": "train"}, {"batch": 8, "micro": 8},
                       holders=("gen", "train"))


def test_a_fused_copy_counts_its_fixed_bytes_beyond_its_weights():
    setup = fused_collocated()
    held, ranks = {"gen": 8.0, "train": 8.0}, {"gen": 4, "train": 4}
    per_device, why = MemoryCheck(setup).evaluate(profile(1 * GIB), held, ranks)
    # By hand: the trainer's 70 GiB, plus the generator's 40 GiB less the 1 GiB of weights it takes from it.
    assert per_device == {"0:0-3": (70 + 40 - 1) * GIB}
    assert "109.0 GiB" in why and "80.0 GiB they have" in why
    # A profile without the generator's weight bytes reads as before: all of its fixed bytes are shared.
    old, why_old = MemoryCheck(setup).evaluate(profile(0.0), held, ranks)
    assert old == {"0:0-3": 70 * GIB} and why_old == ""


def test_the_search_rejects_the_fused_plan_that_only_the_old_pricing_fitted():
    old = search(SPACE, profile(0.0), 4, top=1).ranked[0]
    assert old.choice.fusions == (("gen", "train"),)  # the old pricing chose the fused plan: 70 GiB a device
    assert max(old.memory.values()) == 70 * GIB

    found = search(SPACE, profile(1 * GIB), 4, top=3)
    chosen = found.ranked[0]
    assert chosen.choice.fusions == ()  # the fused plan needs 109 GiB a device: rejected
    assert chosen.plan is not None and max(chosen.memory.values()) <= 80 * GIB
    assert found.reasons.get(MEMORY, 0) > 0
    fused = Searcher(SPACE, profile(1 * GIB), 4)
    assert fused.memory(fused_collocated())[0] == {"0:0-3": 109 * GIB}
    # Every ranked plan fits by the new rule, the fused one among none of them.
    assert all(c.choice.fusions == () for c in found.ranked)


def test_weight_bytes_above_the_fixed_bytes_share_only_the_fixed_bytes():
    k = ComponentCost(mem_fixed=2 * GIB, weight_bytes=3 * GIB)
    assert k.shared_bytes() == 2 * GIB
    assert replace(k, weight_bytes=0.0).shared_bytes() == 2 * GIB
    assert replace(k, weight_bytes=0.5 * GIB).shared_bytes() == 0.5 * GIB
