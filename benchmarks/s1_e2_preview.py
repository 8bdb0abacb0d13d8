"""S1 preview: the simulator's predictions for E2's six plans against their measured iteration times.

No new runs: reads ``benchmarks/results/e2_placements.json`` (E2, measured on this machine). The
cost model is built from the *sequential* plan's measurements alone (env, rollout and actor busy
seconds per iteration, one rank each) plus R1's small-message one-way latency; every plan is
built by the embodied workflow's own plan function from E2's config and simulated on 2 cores.
Prints predicted vs measured per plan, the median absolute error, Kendall's tau of the two
orders, and whether the predicted best is the measured best; writes
``benchmarks/results/s1_e2_preview.json``.

    python benchmarks/s1_e2_preview.py [--latency 240e-6] [--actor-two-ranks]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from e2_placements import PLANS  # noqa: E402

from m2flow.config import from_dict  # noqa: E402
from m2flow.planner.cost import ComponentCost, CostModel, Link, fit_component  # noqa: E402
from m2flow.planner.setup import setup_from_plan  # noqa: E402
from m2flow.planner.simulate import Simulator  # noqa: E402
from m2flow.runtime.placement import NodeLayout  # noqa: E402
from m2flow.workflows.embodied.config import EmbodiedConfig  # noqa: E402
from m2flow.workflows.embodied.graph import GRAPH  # noqa: E402
from m2flow.workflows.embodied.plan import WORKLOAD  # noqa: E402
from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED  # noqa: E402

STEPS, ENVS = 256, 8


def kendall_tau(a: list[float], b: list[float]) -> float:
    pairs = list(itertools.combinations(range(len(a)), 2))
    score = sum((1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1) for i, j in pairs if a[i] != a[j] and b[i] != b[j])
    return score / len(pairs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--latency", type=float, default=240e-6, help="one-way small-message seconds (R1)")
    p.add_argument("--actor-two-ranks", action="store_true",
                   help="also fit the actor on its measured 2-rank time (from the hybrid-pipelined plan)")
    p.add_argument("--e2", type=Path, default=HERE / "results" / "e2_placements.json")
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: results/s1_e2_preview*.json)")
    args = p.parse_args()
    if args.out is None:
        args.out = HERE / "results" / f"s1_e2_preview{'_actor2' if args.actor_two_ranks else ''}.json"
    measured = json.loads(args.e2.read_text())["summary"]
    seq = measured["collocated-sequential"]
    # Seconds per item on one rank, from the sequential plan: an env step of one env, one action, one
    # transition of the update (all epochs).
    actor = ComponentCost(c=seq["actor_s"] / (STEPS * ENVS))
    if args.actor_two_ranks:  # the one cost the sequential plan cannot show: the actor on two ranks
        two = measured["hybrid-pipelined"]["actor_s"]
        actor = fit_component([(STEPS * ENVS, 1, seq["actor_s"]), (STEPS * ENVS, 2, two)]).cost
    cost = CostModel({
        "env": ComponentCost(c=seq["env_stage_s"] / (STEPS * ENVS)),
        "rollout": ComponentCost(c=seq["rollout_stage_s"] / (STEPS * ENVS)),
        "actor": actor,
    }, link=Link(bandwidth=1e9, latency=args.latency), cores=2)  # E2 ran on 2 cores
    sim = Simulator(GRAPH, WORKLOAD, cost)
    rows = []
    unmeasured = [name for name in PLANS if name not in measured]
    if unmeasured:  # plans E2 gained after that file was measured
        print(f"not in {args.e2.name}, skipped: {', '.join(unmeasured)}")
    for name, (placement, stages, fused) in PLANS.items():
        if name in unmeasured:
            continue
        env_ranks = from_dict(EmbodiedConfig, {"placement": placement}).placed()["env"].world_size
        cfg = from_dict(EmbodiedConfig, {"cluster": {"cpu_devices_per_node": 8}, "placement": placement,
                                         "pipeline_stages": stages, "rollout_steps": STEPS,
                                         "env": {"num_envs": ENVS // env_ranks},
                                         "rollout": {"fuse_with_env": fused}})
        plan = EMBODIED.plan(cfg, NodeLayout((8,)))
        predicted = sim.simulate(setup_from_plan(plan)).iteration_time
        got = measured[name]["step_s"]
        rows.append({"plan": name, "placement": placement, "stages": stages, "fused": fused,
                     "predicted_s": predicted, "measured_s": got, "error": predicted / got - 1})
        print(f"{name:26s} predicted {predicted:.3f} s  measured {got:.3f} s  error {predicted / got - 1:+.1%}")
    errors = [abs(r["error"]) for r in rows]
    tau = kendall_tau([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
    best_pred = min(rows, key=lambda r: r["predicted_s"])["plan"]
    best_meas = min(rows, key=lambda r: r["measured_s"])["plan"]
    summary = (f"S1 preview on E2: median |error| {statistics.median(errors):.1%}, Kendall tau {tau:.2f}, "
               f"predicted best {best_pred} (measured best {best_meas})")
    args.out.write_text(json.dumps({"benchmark": "s1_e2_preview", "latency_s": args.latency,
                                    "actor_two_ranks": args.actor_two_ranks, "rows": rows,
                                    "median_abs_error": statistics.median(errors), "kendall_tau": tau,
                                    "summary": summary}, indent=1))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
