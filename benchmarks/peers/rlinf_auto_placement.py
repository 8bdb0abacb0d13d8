"""RLinf's auto-placement planner side of S3, run by the RLinf venv's python.

    python rlinf_auto_placement.py TOOLKIT_DIR < scenarios.json

``TOOLKIT_DIR`` is ``toolkits/auto_placement`` of an RLinf checkout; its modules are imported as
they are and driven the way its own unit tests drive them: the config objects its
``init_global_config`` reads are filled from each scenario, then ``AutoPlacementWorker.run()``
plans. Nothing of the planner is re-implemented here. Per scenario the answer holds the chosen
placement (device ranges per role, in the planner's own order), its mode, its own estimate of the
iteration time (``total_cost``), the planner's printed answer (as its ``main`` formats it) and the
planning time. ``estimate`` entries ask the planner's own cost model for the time of given plans
(a chain split or collocated), built from its ``ScheduleResult`` classes as its search builds them.

Input: a JSON list of scenarios; output: one line ``RESULT {...}`` with a list of answers.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any


def _config(s: dict[str, Any]) -> tuple[NS, NS, NS]:
    """(cfg, component_placement, cluster) as ``init_global_config`` and the nodes read them."""
    n = s["total_gpus"]
    if s["task_type"] == "reasoning":
        mp = s.get("model_parallel", {})
        # the components its placement names (without inference, the planner derives it from the actor)
        comps = s.get("components", ["actor", "rollout", "inference"])
        cp = NS(_cluster_num_gpus=n, _components=comps)
        for c in comps:
            setattr(cp, f"{c}_world_size", n)
            setattr(cp, f"{c}_dp_size", n // mp.get(c, 1))
        cfg = NS(runner=NS(task_type="reasoning", seq_length=s.get("seq_length", 1024)),
                 algorithm=NS(group_size=s["group_size"], n_minibatches=s["n_minibatches"],
                              recompute_logprobs=s.get("recompute_logprobs", True)),
                 data=NS(rollout_batch_size=s["rollout_batch_size"]),
                 rollout=NS(max_running_requests=s["max_running_requests"], gpu_memory_utilization=0.55),
                 profile_data=NS(actor_cost=s["actor_cost"], rollout_cost=s["rollout_cost"],
                                 inference_cost=s["inference_cost"]))
    else:
        comps = ["env", "rollout", "actor"]
        cp = NS(_components=comps, get_world_size=lambda c: n)
        cfg = NS(runner=NS(task_type="embodied"), algorithm=NS(group_size=1),
                 data=NS(env_num=s["env_num"], rollout_batch_size=1),
                 profile_data=NS(actor_cost=s["actor_cost"],
                                 env_profile_data={int(k): v for k, v in s["env_profile_data"].items()},
                                 rollout_profile_data={int(k): v for k, v in s["rollout_profile_data"].items()}))
    return cfg, cp, NS(num_accelerators=n)


def _printed(res: Any, mode_enum: Any) -> str:
    """The answer as the planner's ``main`` prints it."""
    if res.mode == mode_enum.COLLOCATED and not res.is_hybrid():
        return ", ".join(node.role for node in res.placement if node.role != "inference") + " : all"
    return res.placement_str.strip()


def _estimate(worker: Any, spec: dict[str, Any], total: int, placement: Any, workflow_mod: Any) -> float | None:
    """RLinf's own estimate of one plan: ``{"collocated": true}`` or ``{"split": [[role, gpus], ...]}``
    (chain order; for embodied, env and env_rollout split and the actor collocated over both)."""
    SR = placement.ScheduleResult
    worker._result_cache = {}

    def leaf(role: str, gpus: int) -> Any:
        return worker._find_schedule(workflow_mod.Workflow({worker.get_node(role): []}), gpus)

    roles = [n.role for n in worker.workflow.topological_order]
    if spec.get("collocated"):
        res = leaf(roles[0], total)
        for r in roles[1:]:
            res = SR.merger_schedule_results(total, res, leaf(r, total), is_collocated=True)
        return None if res is None else res.total_cost
    split = [(r, int(g)) for r, g in spec["split"]]
    if worker.config.task_type == "embodied":  # (env | env_rollout) collocated with the actor
        (_, g_env), (_, g_roll) = split
        inner = SR.merger_schedule_results(g_env + g_roll, leaf("env", g_env), leaf("env_rollout", g_roll),
                                           is_collocated=False)
        res = SR.merger_schedule_results(total, inner, leaf("actor", total), is_collocated=True)
        return None if res is None else res.total_cost
    best = None
    for nest in ("left", "right"):  # the two cut orders its search tries for a chain of three
        parts = [leaf(r, g) for r, g in split]
        if any(p is None for p in parts):
            return None
        if len(parts) == 2:
            res = SR.merger_schedule_results(total, parts[0], parts[1], is_collocated=False)
        elif nest == "left":
            first = SR.merger_schedule_results(split[0][1] + split[1][1], parts[0], parts[1], is_collocated=False)
            res = SR.merger_schedule_results(total, first, parts[2], is_collocated=False)
        else:
            rest = SR.merger_schedule_results(split[1][1] + split[2][1], parts[1], parts[2], is_collocated=False)
            res = SR.merger_schedule_results(total, parts[0], rest, is_collocated=False)
        if res is not None and (best is None or res.total_cost < best):
            best = res.total_cost
    return best


def run_one(s: dict[str, Any], mods: dict[str, Any]) -> dict[str, Any]:
    apw, util, placement, workflow_mod = mods["apw"], mods["util"], mods["placement"], mods["workflow"]
    cfg, cp, cluster = _config(s)
    graph = apw.get_workflow_graph(cfg)
    times, cpus, res, worker = [], [], None, None
    for _ in range(max(1, s.get("repeats", 1))):
        t0, c0 = time.perf_counter(), time.process_time()
        util.init_global_config(cfg, cp, cluster)
        worker = apw.AutoPlacementWorker(cfg, cp, graph)
        res = worker.run()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    out: dict[str, Any] = {"name": s["name"], "plan_s": statistics.median(times), "cpu_s": statistics.median(cpus),
                           "graph": graph}
    if res is None:
        out.update(found=False)
    else:
        out.update(found=True, mode=res.mode.value, hybrid=res.is_hybrid(), estimate_s=res.total_cost,
                   printed=_printed(res, placement.ScheduleMode),
                   placement=[[node.role, r[0], r[-1]] for node, r in res.placement.items()])
    out["estimates"] = [_estimate(worker, spec, s["total_gpus"], placement, workflow_mod)
                        for spec in s.get("estimate", [])]
    return out


def run_cli(toolkit: str, config_dir: str, config_name: str) -> int:
    """RLinf's own command line (``auto_placement_worker.py --config-path D --config-name N``), on a
    private loopback Ray (the planner's ``main`` builds an RLinf ``Cluster``, which starts or joins Ray)."""
    import runpy

    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    from rlinf_peer import _private_ray  # noqa: PLC0415

    _private_ray()
    script = str(Path(toolkit) / "auto_placement_worker.py")
    sys.argv = [script, "--config-path", config_dir, "--config-name", config_name]
    runpy.run_path(script, run_name="__main__")
    return 0


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[2] == "--cli":
        sys.path.insert(0, sys.argv[1])
        return run_cli(*sys.argv[1:2], *sys.argv[3:5])
    sys.path.insert(0, sys.argv[1])
    import auto_placement_worker as apw  # noqa: PLC0415 (the checkout's modules, importable only now)
    import placement
    import util
    import workflow

    mods = {"apw": apw, "util": util, "placement": placement, "workflow": workflow}
    scenarios = json.loads(sys.stdin.read())
    answers = []
    for s in scenarios:
        try:
            answers.append(run_one(s, mods))
        except Exception as e:  # report, do not hide: the scenario is outside what RLinf's planner handles
            answers.append({"name": s["name"], "found": False, "error": f"{type(e).__name__}: {e}"})
    print("RESULT " + json.dumps(answers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
