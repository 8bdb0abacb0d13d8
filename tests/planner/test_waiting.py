"""Waiting is not computing: a component's CPU share limits what it asks of the cores, so env workers that
mostly wait on a tool spread past the core count for free, and only then."""

from __future__ import annotations

import pytest

from m2flow.planner import Component, Edge, Fusion, WorkflowGraph
from m2flow.planner.cost import ComponentCost, CostModel, Link
from m2flow.planner.profile_file import ProfileError, cost_model
from m2flow.planner.search import SearchSpace, Searcher, search
from m2flow.planner.setup import Workload, build_setup
from m2flow.planner.simulate import Simulator

# The agentic shape: env and a model-holding rollout alternate for every turn; the actor trains after.
GRAPH = WorkflowGraph("tools", (Component("env", "steps text envs whose tool waits"),
                                Component("gen", "model turns", holds_model=True),
                                Component("train", "trains", holds_model=True, trains=True)),
                      (Edge("actions", "gen", "env", "text", kind="p2p"),
                       Edge("observations", "env", "gen", "EnvStep", kind="p2p"),
                       Edge("trajectories", "gen", "train", "GroupSample"),
                       Edge("weights", "train", "gen", "w", kind="weights")),
                      (Fusion("env", "gen", "in the rollout's processes"),))
WORKLOAD = Workload(chain=("train",), items=("episodes",), loop=("env", "gen"), loop_steps="turns",
                    loop_items=("episodes",), inputs={"gen": ("observations",), "env": ("actions",),
                                                      "train": ("trajectories",)},
                    weights=(("train", "gen"),))
SETTINGS = {"episodes": 32, "turns": 2}


def _profile(share: float | None, latency: float = 0.0) -> dict:
    """A hand-made profile: a call of env on b episodes over d ranks takes 0.01 * b / d s (a tool's wait,
    mostly), one of gen 0.05 s, one of train 0.2 s; two cores; ``share``: env's CPU share (None: left out,
    as in a profile written before the field existed)."""
    env = {"a": 0.0, "c": 0.01, "alpha": 1.0}
    if share is not None:
        env["cpu_share"] = share
    return {"format": 2, "workflow": "tools", "device": {"cores": 2},
            "link": {"bandwidth": 1e9, "latency": latency, "local_latency": 0.0, "dispatch": latency},
            "components": {"env": env, "gen": {"a": 0.05}, "train": {"a": 0.2}}}


def _iteration(model: CostModel, env_ranks: int) -> float:
    """Predicted seconds of ``env: 0..n-1, gen: n, train: n+1``, one thread each, every device on one node."""
    blocks = [(("env",), 0, env_ranks), (("gen",), env_ranks, 1), (("train",), env_ranks + 1, 1)]
    setup = build_setup(blocks, {}, SETTINGS, holders=("gen", "train"), devices_per_node=8)
    return Simulator(GRAPH, WORKLOAD, model).simulate(setup).iteration_time


def test_two_plans_env_workers_past_the_cores_pay_only_when_the_env_computes():
    # An iteration: two turns of (gen 0.05 s, env 0.32 / d s), then train 0.2 s; only env runs during its steps.
    # d = 2 fits the 2 cores: 2 * (0.05 + 0.16) + 0.2 = 0.62 s whatever env's share.
    # d = 4, share 1: 4 threads on 2 cores, half speed: 0.08 / 0.5 = 0.16 s a step, no gain: 0.62 s.
    # d = 4, share 0.1: it asks 0.4 of a core: full speed, 0.08 s a step: 2 * (0.05 + 0.08) + 0.2 = 0.46 s.
    # d = 4, share 0.75: computing speed v with 4 * 0.75 v / (0.25 v + 0.75) = 2 cores: v = 0.6, a step takes
    # 0.08 * (0.25 + 0.75 / 0.6) = 0.12 s (= 4 ranks x 0.75 x 0.08 CPU-s over 2 cores): 0.54 s.
    for share, four in ((1.0, 0.62), (0.1, 0.46), (0.75, 0.54)):
        model = cost_model(_profile(share))
        assert _iteration(model, 2) == pytest.approx(0.62)
        assert _iteration(model, 4) == pytest.approx(four)


def test_overlapping_calls_share_the_cores_in_their_computing_only():
    # Two single-thread processes, each a 2 s call computing a share s of it, overlap on one core: each takes
    # max(2 s, all the computing, 2 * 2 * s, over the one core).
    model = CostModel({"x": ComponentCost()}, cores=1)
    for share, seconds in ((1.0, 4.0), (0.9, 3.6), (0.7, 2.8), (0.5, 2.0), (0.1, 2.0)):
        v = model.node_speed([(1, share), (1, share)])
        assert 2.0 / model.rate(v, 1, share, 2 * share > 1) == pytest.approx(seconds)
    assert model.node_speed([(3, 1.0), (1, 1.0)]) == pytest.approx(0.25)  # the old rule: cores over threads
    assert CostModel({"x": ComponentCost()}).node_speed([(8, 1.0)]) == 1.0  # GPUs do not contend


@pytest.mark.parametrize("share, spread", [(0.1, True), (1.0, False)])
def test_the_search_spreads_env_workers_past_the_cores_exactly_when_they_wait(share, spread):
    # A message costs 2 ms, so more env ranks than the cores buy nothing unless the env waits.
    model = cost_model(_profile(share, latency=2e-3))
    space = SearchSpace(GRAPH, WORKLOAD, ("env", "gen", "train"), SETTINGS, fusions=(("env", "gen"),))
    best = search(space, model, 8, top=1).ranked[0]
    env_ranks = best.setup.components["env"].ranks
    assert (env_ranks > 2) is spread, (best.placement, env_ranks)
    if spread:  # apart from the rollout, in processes of its own
        assert best.setup.components["env"].host == "env"


def test_the_fast_bound_never_exceeds_the_simulation_with_waiting_components():
    for share in (0.05, 0.4, 0.8):
        searcher = Searcher(SearchSpace(GRAPH, WORKLOAD, ("env", "gen", "train"), SETTINGS,
                                        fusions=(("env", "gen"),)), cost_model(_profile(share, latency=1e-3)), 6)
        entries = searcher.entries()
        assert len(entries) > 30
        for entry in entries[::3]:
            cand = searcher._candidate(entry)
            assert cand.bound <= searcher.sim.simulate(cand.setup).iteration_time + 1e-9


def test_a_profile_without_the_cpu_share_loads_as_before():
    old, explicit = cost_model(_profile(None)), cost_model(_profile(1.0))
    assert old.component("env").cpu_share == 1.0 and old == explicit
    assert _iteration(old, 4) == pytest.approx(0.62)
    # Measured points carry the share through the fit too.
    fitted = cost_model({**_profile(None), "components": {"env": {"points": [[8, 1, 0.1], [32, 1, 0.4]],
                                                                  "cpu_share": 0.2}, "gen": {"a": 0.05}}})
    assert fitted.component("env").cpu_share == 0.2 and fitted.component("env").c == pytest.approx(0.0125)
    with pytest.raises(ProfileError, match="cpu_share must be in"):
        cost_model({**_profile(1.5)})
