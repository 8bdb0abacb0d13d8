"""S2: time to plan on 8 ... 4096 simulated devices, on synthetic workloads shaped like RLinf's.

Two scenarios, each in two variants whose costs pull toward different modes:

* ``grpo``: reasoning GRPO (rollout, reward, inference, actor), 64 responses per device per
  iteration. ``long``: long-context generation, where a call's longest response sets a floor that
  more devices do not shorten (large fixed cost, sub-linear scaling) and KV cache is large;
  ``short``: short responses that scale almost linearly.
* ``ppo``: embodied PPO (env, rollout, actor), 64 envs per env rank, 32 steps per iteration.
  ``heavy``: a simulator that costs more than the policy (CPU-style physics);
  ``light``: a GPU-parallel simulator beside a large policy (a vision-language-action model).

Costs are in the shapes RLinf's papers report (7B-class models on 80 GiB accelerators, generation
dominating long-context GRPO), not measurements: S2 measures the planner, not the workloads. For
every scale the planner searches all modes, device splits, fusions, chunk sizes / pipeline stages;
the script reports its wall and CPU time (median of ``--repeats``), the best plan's mode and its
simulated speed-up over the best collocated plan, whether that plan was built and passes
``Plan.validate``, and its gap to a reference: the exhaustive search (every device split and inner
size) up to ``--exact-up-to`` devices, above it a much longer search (splits on a grid of N/64,
local search from 16 starts, every variant on every split visited).

    python benchmarks/s2_planner_scale.py [--scales 8 64 512 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from m2flow.planner import Component, Edge, Fusion, WorkflowGraph  # noqa: E402
from m2flow.planner.cost import ComponentCost, CostModel, Link  # noqa: E402
from m2flow.planner.search import SearchSpace, search  # noqa: E402
from m2flow.planner.setup import Workload  # noqa: E402

GIB = 2.0 ** 30
RESULTS = Path(__file__).resolve().parent / "results"

GRPO_GRAPH = WorkflowGraph(
    "grpo", (Component("rollout", "generates", holds_model=True), Component("reward", "scores"),
             Component("inference", "log-probs", holds_model=True), Component("actor", "trains", holds_model=True)),
    (Edge("responses", "rollout", "reward", "Sample"), Edge("scored", "reward", "inference", "Sample"),
     Edge("ready", "inference", "actor", "Sample"), Edge("weights", "actor", "rollout", "w", kind="weights"),
     Edge("policy_weights", "actor", "inference", "w", kind="weights")),
    (Fusion("reward", "rollout", "same devices"),))
GRPO = Workload(chain=("rollout", "reward", "inference", "actor"), items=("prompts", "group"),
                micro_items=("chunk", "group"),
                inputs={"reward": ("responses",), "inference": ("scored",), "actor": ("ready",)},
                weights=(("actor", "rollout"), ("actor", "inference")))
PPO_GRAPH = WorkflowGraph(
    "ppo", (Component("env", "simulates"), Component("rollout", "acts", holds_model=True),
            Component("actor", "trains", holds_model=True)),
    (Edge("observations", "env", "rollout", "Obs", kind="p2p"), Edge("actions", "rollout", "env", "Act", kind="p2p"),
     Edge("trajectories", "env", "actor", "Traj", kind="p2p"),
     Edge("weights", "actor", "rollout", "w", kind="weights")),
    (Fusion("rollout", "env", "same devices"),))
PPO = Workload(chain=("actor",), items=("envs", "steps"), items_per_rank_of="env", loop=("env", "rollout"),
               loop_steps="steps", loop_items=("envs",), stages="stages",
               inputs={"rollout": ("observations",), "env": ("actions",), "actor": ("trajectories",)},
               weights=(("actor", "rollout"),))


def grpo(variant: str, devices: int) -> tuple[SearchSpace, CostModel]:
    """Long- or short-context GRPO of a 7B-class model, 64 responses per device (16 per prompt)."""
    long = variant == "long"
    prompts = 4 * devices
    chunks = tuple(sorted({max(1, prompts // k) for k in (1, 4, 16, 64)}))
    space = SearchSpace(GRPO_GRAPH, GRPO, ("rollout", "reward", "inference", "actor"),
                        {"prompts": prompts, "group": 16, "chunk": prompts}, varied={"chunk": chunks},
                        fusions=(("reward", "rollout"),))
    comps = {
        # Generation: a call's longest response is a floor (a); decoding scales sub-linearly.
        # Long context: decoding is memory-bound and a call's longest response sets its length, so
        # more devices help less (alpha 0.5: generation grows as sqrt(devices) at a fixed batch per
        # device, overtaking training from about 512 devices); short responses scale almost linearly.
        "rollout": ComponentCost(a=0.5 if long else 2.0, c=0.05 if long else 0.15, alpha=0.5 if long else 0.97,
                                 mem_fixed=16 * GIB, mem_per_item=(0.6 if long else 0.05) * GIB,
                                 state_bytes=15 * GIB, weight_bytes=15 * GIB),
        "reward": ComponentCost(a=0.05, c=0.002, alpha=1.0, mem_fixed=0.5 * GIB),
        "inference": ComponentCost(a=1.0, c=0.08 if long else 0.02, alpha=0.98, mem_fixed=15 * GIB,
                                   mem_per_item=0.05 * GIB, state_bytes=15 * GIB),
        # Per call (a micro-batch of chunks): gradients accumulate, so little is fixed per call.
        "actor": ComponentCost(a=0.2, c=1.0 if long else 0.06, alpha=0.95, s=0.05, mem_fixed=45 * GIB,
                               mem_per_item=0.02 * GIB, state_bytes=60 * GIB, weight_bytes=15 * GIB),
    }
    model = CostModel(comps, edge_bytes={"responses": 64e3, "scored": 64e3, "ready": 64e3},
                      link=Link(bandwidth=25e9, latency=2e-5), offload_bandwidth=25e9, device_memory=80 * GIB)
    return space, model


def ppo(variant: str, devices: int) -> tuple[SearchSpace, CostModel]:
    """Embodied PPO with a VLA-sized policy: 64 envs per env rank, 32 steps per iteration."""
    heavy = variant == "heavy"
    space = SearchSpace(PPO_GRAPH, PPO, ("env", "rollout", "actor"), {"envs": 64, "steps": 32, "stages": 1},
                        varied={"stages": (1, 2, 4)}, fusions=(("rollout", "env"),))
    comps = {
        "env": ComponentCost(a=0.01, c=0.02 if heavy else 0.0004, alpha=1.0, mem_fixed=4 * GIB,
                             mem_per_item=0.05 * GIB),
        "rollout": ComponentCost(a=0.03, c=0.002 if heavy else 0.004, alpha=0.9, mem_fixed=16 * GIB,
                                 mem_per_item=0.1 * GIB, state_bytes=15 * GIB),
        "actor": ComponentCost(a=1.0, c=0.004, alpha=0.95, s=0.4, mem_fixed=45 * GIB, mem_per_item=0.005 * GIB,
                               state_bytes=60 * GIB, weight_bytes=15 * GIB),
    }
    model = CostModel(comps, edge_bytes={"observations": 200e3, "actions": 1e3, "trajectories": 200e3},
                      link=Link(bandwidth=25e9, latency=5e-5), offload_bandwidth=25e9, device_memory=80 * GIB)
    return space, model


SCENARIOS = {("grpo", "long"): grpo, ("grpo", "short"): grpo, ("ppo", "heavy"): ppo, ("ppo", "light"): ppo}


REFERENCE = {"grid": 64, "starts": 16, "keep": None}
"""The reference search above the exhaustive range: ~8x finer grid, 8x the starts, nothing dropped."""


def plan_once(name: str, variant: str, devices: int, exact_limit: int = 16, **options) -> tuple[float, dict]:
    """(wall seconds, facts of the best plan); the facts include the search's CPU seconds."""
    space, model = SCENARIOS[(name, variant)](variant, devices)
    t0, c0 = time.perf_counter(), time.process_time()
    result = search(space, model, devices, top=1, devices_per_node=8, exact_limit=exact_limit, **options)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    best = result.ranked[0]
    try:  # the plan the search returns is built; check it once more against the graph
        valid = best.plan is not None and best.plan.validate(space.graph) is best.plan
    except ValueError:
        valid = False
    ref = result.collocated.seconds_per_item if result.collocated is not None else float("nan")
    return seconds, {
        "best_mode": best.shape.mode, "placement": best.placement if devices <= 64 else _short(best),
        "fusions": [list(pair) for pair in best.choice.fusions], "settings": best.choice.values,
        "iteration_s": best.result.iteration_time, "speedup_vs_collocated": ref / best.seconds_per_item,
        "bottleneck": best.result.bottleneck, "considered": result.considered, "simulated": result.simulated,
        "rejected": len(result.rejected), "exact": result.exact,
        "rejected_example": result.rejected[0].rejected if result.rejected else "",
        "seconds_per_item": best.seconds_per_item, "cpu_s": cpu, "valid_plan": valid,
        "rejected_by_reason": result.reasons,
    }


def _short(cand) -> str:
    """The placement as blocks and device counts (the string itself names ranges of thousands)."""
    return cand.placement if len(cand.placement) < 120 else f"{cand.shape} parts {cand.parts}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[8, 64, 512, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", nargs="+", default=[f"{a}/{b}" for a, b in SCENARIOS],
                        help="scenario/variant pairs to run")
    parser.add_argument("--exact-up-to", type=int, default=32,
                        help="the reference is the exhaustive search up to this many devices, the long search above")
    parser.add_argument("--gap-scales", type=int, nargs="*", default=[16, 32, 64],
                        help="device counts where the scalable search (forced, even where the default is "
                             "exhaustive) is compared with the exhaustive one")
    parser.add_argument("--out", type=Path, default=RESULTS / "s2_planner_scale.json")
    args = parser.parse_args()
    rows = []
    for name, variant in (tuple(x.split("/")) for x in args.scenarios):
        for n in args.scales:
            times, cpus, info = [], [], {}
            for _ in range(args.repeats):
                seconds, info = plan_once(name, variant, n)
                times.append(seconds)
                cpus.append(info["cpu_s"])
            load = os.getloadavg()[0]
            exact = n <= args.exact_up_to
            ref_s, ref = plan_once(name, variant, n, exact_limit=n) if exact else plan_once(name, variant, n, **REFERENCE)
            gap = info["seconds_per_item"] / ref["seconds_per_item"] - 1
            row = {"scenario": name, "variant": variant, "devices": n, "plan_s": statistics.median(times),
                   "plan_s_all": times, **info, "cpu_s": statistics.median(cpus), "load_1min": load,
                   "reference": "exhaustive" if exact else "long search", "reference_s": ref_s,
                   "reference_considered": ref["considered"], "reference_valid_plan": ref["valid_plan"], "gap": gap}
            rows.append(row)
            print(f"{name}/{variant} {n:5d} devices: {row['plan_s']:.3f} s to plan ({row['cpu_s']:.3f} s CPU,"
                  f" load {load:.1f}), best {row['best_mode']}"
                  f" {row['speedup_vs_collocated']:.2f}x collocated ({row['bottleneck']} bottleneck),"
                  f" {row['considered']} bounded / {row['simulated']} simulated, valid {row['valid_plan']};"
                  f" {gap:+.2%} from the {row['reference']} ({ref['considered']} bounded, {ref_s:.1f} s)", flush=True)
    gaps = []
    for name, variant in (tuple(x.split("/")) for x in args.scenarios):
        for n in args.gap_scales:  # the scalable search against the exhaustive one where both run
            exact_s, exact = plan_once(name, variant, n, exact_limit=n)
            fast_s, fast = plan_once(name, variant, n, exact_limit=4)
            gap = fast["seconds_per_item"] / exact["seconds_per_item"] - 1
            gaps.append({"scenario": name, "variant": variant, "devices": n, "gap": gap, "exact_plan_s": exact_s,
                         "scalable_plan_s": fast_s, "exact_considered": exact["considered"],
                         "scalable_considered": fast["considered"], "valid_plan": fast["valid_plan"]})
            print(f"{name}/{variant} {n:5d} devices: scalable search {gap:+.2%} from exhaustive "
                  f"({fast['considered']} vs {exact['considered']} candidates, {fast_s:.2f} s vs {exact_s:.2f} s)",
                  flush=True)
    top = max(args.scales)
    worst = max(r["plan_s"] for r in rows if r["devices"] == top)
    worst_cpu = max(r["cpu_s"] for r in rows if r["devices"] == top)
    modes = sorted({r["best_mode"] for r in rows})
    summary = (f"S2: worst planning time at {top} devices {worst:.3f} s wall, {worst_cpu:.3f} s CPU "
               f"(goal < 1 s); best modes seen: {', '.join(modes)}; largest gap to the reference "
               f"{max(r['gap'] for r in rows):+.2%} (goal <= 2%); of the scalable search to exhaustive "
               f"{max((g['gap'] for g in gaps), default=0.0):+.2%}; every returned plan valid: "
               f"{all(r['valid_plan'] for r in rows) and all(g['valid_plan'] for g in gaps)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "s2_planner_scale", "python": platform.python_version(),
                                    "machine": platform.node(), "reference_options": REFERENCE,
                                    "command": " ".join(["python", "benchmarks/s2_planner_scale.py", *sys.argv[1:]]),
                                    "rows": rows, "gaps": gaps, "summary": summary},
                                   indent=1))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
