"""S3's scenarios: one planning problem stated both ways, as m2flow's cost model and as RLinf's input.

RLinf's auto-placement planner takes, for reasoning, each component's seconds per iteration measured
collocated on all GPUs (``actor_cost``, ``inference_cost``, ``rollout_cost``) plus the batch shape
and the rollout engine's ``max_running_requests``, and extrapolates other GPU counts with its own
formulas; for embodied, seconds per iteration of env and policy by envs per instance
(``env_profile_data``, ``rollout_profile_data``) and the actor's collocated cost. Every scenario
here is a ``Scenario``: our ``SearchSpace`` and ``CostModel`` and the dict the RLinf driver
(``peers/rlinf_auto_placement.py``) turns into the planner's config.

Two directions:

* ``from_ours``: S2's synthetic workloads and E2's measured costs. RLinf's numbers are what its
  profiling step would measure under our model: each component's busy seconds in the collocated
  plan (``Simulator.work``), the per-instance env and policy seconds at every instance count it may
  ask for (exact, so its fitter never extrapolates), and ``max_running_requests`` = the responses a
  rollout device holds in memory.
* ``from_rlinf``: the planner's own test and example inputs. Our cost model is what a single
  collocated measurement gives our fitter: time linear in items per device (``alpha = 1``), nothing
  fixed per call; its embodied per-instance profiles are fitted as ``a + c * items`` points.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from s2_planner_scale import GRPO, GRPO_GRAPH, PPO, PPO_GRAPH, grpo, ppo  # noqa: E402

from m2flow.planner.cost import ComponentCost, CostModel, Link, fit_component  # noqa: E402
from m2flow.planner.search import SearchSpace  # noqa: E402
from m2flow.planner.setup import build_setup  # noqa: E402
from m2flow.planner.simulate import Simulator  # noqa: E402


@dataclass
class Scenario:
    name: str
    kind: str
    """``reasoning`` or ``embodied``"""
    devices: int
    space: SearchSpace
    cost: CostModel
    rlinf: dict[str, Any]
    """the RLinf driver's input (without ``name``/``estimate``, added when it is sent)"""
    notes: list[str] = field(default_factory=list)
    setting: str = ""
    """our plan setting RLinf's plan is read with (``chunk`` or the pipeline stages)"""
    assumed: tuple[Any, Any] = (None, None)
    """its value for RLinf's collocated and split plans, as its model or its examples have them"""

    def as_assumed(self, split: bool) -> dict[str, Any]:
        """Our plan settings for an RLinf plan taken as the planner states it (nothing fused): reasoning
        phases on the whole batch when collocated, pipelined one prompt's group at a time when split (its
        cost formula); embodied one pipeline stage collocated, two split (RLinf's disaggregated example
        configs)."""
        return {self.setting: self.assumed[split]}


def collocated_setup(space: SearchSpace, cost: CostModel, n: int, settings: dict[str, Any] | None = None):
    """Every running component on all ``n`` devices, no fusion (``placement: all``)."""
    return build_setup([(space.running, 0, n)], {c: c for c in space.running}, {**space.settings, **(settings or {})},
                       holders=space.holders, threads=space.threads,
                       devices_per_node=n if cost.cores is not None else None)


# -- ours -> RLinf -----------------------------------------------------------------------------------
def reasoning_from_ours(name: str, space: SearchSpace, cost: CostModel, n: int, slots: str = "memory") -> Scenario:
    """RLinf's reasoning input for one of S2's GRPO workloads on ``n`` devices. ``slots`` sets the
    rollout engine's ``max_running_requests``: ``memory``, the responses a device's memory holds
    (what one would configure); ``batch``, the responses per device of the collocated plan (then
    its rollout model scales linearly below all GPUs, closest to a near-linear cost)."""
    s = space.settings
    prompts, group = int(s["prompts"]), int(s["group"])
    sim = Simulator(space.graph, space.workload, cost)
    # Collocated, one call per component on the whole batch: the phases RLinf's profiling times.
    busy = sim.work(collocated_setup(space, cost, n, {"chunk": prompts}))
    roll = cost.component("rollout")
    held = int((cost.device_memory - roll.mem_fixed) // roll.mem_per_item) if roll.mem_per_item else 1 << 20
    if slots == "batch":
        held = math.ceil(prompts * group / n)
    rl = {"task_type": "reasoning", "total_gpus": n, "group_size": group, "n_minibatches": 1,
          "rollout_batch_size": prompts, "max_running_requests": held, "recompute_logprobs": True,
          "components": ["actor", "rollout", "inference"],
          "actor_cost": busy["actor"], "inference_cost": busy["inference"], "rollout_cost": busy["rollout"]}
    why = "responses per device that fit in memory" if slots == "memory" else "responses per device collocated"
    notes = [f"collocated seconds per iteration: rollout {busy['rollout']:.2f}, inference {busy['inference']:.2f}, "
             f"actor {busy['actor']:.2f} (reward {busy['reward']:.3f}, which RLinf does not plan); "
             f"max_running_requests {held} ({why})"]
    return Scenario(name, "reasoning", n, space, cost, rl, notes, "chunk", (prompts, 1))


def embodied_from_ours(name: str, space: SearchSpace, cost: CostModel, n: int, env_num: int,
                       steps_key: str, envs_key: str) -> Scenario:
    """RLinf's embodied input; ``space`` must hold ``env_num`` envs in all (not per env rank)."""
    steps = int(space.settings[steps_key])
    sim = Simulator(space.graph, space.workload, cost)
    busy = sim.work(collocated_setup(space, cost, n, {space.workload.stages: 1}))
    env, pol = cost.component("env"), cost.component("rollout")
    # Seconds per iteration with k envs per instance, i = env_num / k instances (exact at every k asked).
    keys = sorted({env_num // i for i in range(1, n + 1)})
    rl = {"task_type": "embodied", "total_gpus": n, "env_num": env_num, "actor_cost": busy["actor"],
          "env_profile_data": {k: steps * env.time(env_num, env_num / k) for k in keys},
          "rollout_profile_data": {k: steps * pol.time(env_num, env_num / k) for k in keys}}
    notes = [f"{env_num} envs in all, {steps} steps; collocated actor {busy['actor']:.3f} s; env and policy "
             f"seconds per iteration given at every envs-per-instance count the planner can ask for"]
    return Scenario(name, "embodied", n, space, cost, rl, notes, space.workload.stages, (1, 2))


def s2_reasoning(variant: str, n: int, slots: str = "memory") -> Scenario:
    space, cost = grpo(variant, n)
    return reasoning_from_ours(f"s2 grpo/{variant} slots={slots}", space, cost, n, slots)


def s2_embodied(variant: str, n: int) -> Scenario:
    space, cost = ppo(variant, n)
    env_num = 64 * n  # what the collocated plan steps; RLinf's env_num is fixed whatever the split
    space = replace(space, workload=replace(PPO, items_per_rank_of=""), settings={**space.settings, "envs": env_num})
    return embodied_from_ours(f"s2 ppo/{variant}", space, cost, n, env_num, "steps", "envs")


def e2_embodied(e2: dict[str, Any], n: int) -> Scenario:
    """E2's measured costs (the sequential plan's busy times, the actor's 2-rank time; as the S1
    preview builds them) on ``n`` CPU devices sharing 2 cores, 8 envs in all, 256 steps."""
    from m2flow.workflows.embodied.graph import GRAPH
    from m2flow.workflows.embodied.plan import WORKLOAD

    steps, envs = 256, 8
    seq, two = e2["collocated-sequential"], e2["hybrid-pipelined"]
    actor = fit_component([(steps * envs, 1, seq["actor_s"]), (steps * envs, 2, two["actor_s"])]).cost
    cost = CostModel({"env": ComponentCost(c=seq["env_stage_s"] / (steps * envs)),
                      "rollout": ComponentCost(c=seq["rollout_stage_s"] / (steps * envs)), "actor": actor},
                     link=Link(bandwidth=1e9, latency=240e-6), cores=2)
    space = SearchSpace(GRAPH, replace(WORKLOAD, items_per_rank_of=""), ("env", "rollout", "actor"),
                        {"pipeline_stages": 1, "rollout_steps": steps, "envs_per_rank": envs},
                        varied={"pipeline_stages": (1, 2, 4)}, fusions=(("rollout", "env"),))
    return embodied_from_ours("e2 (measured costs, 2 cores)", space, cost, n, envs, "rollout_steps",
                              "envs_per_rank")


# -- RLinf -> ours -----------------------------------------------------------------------------------
RLINF_OWN: dict[str, dict[str, Any]] = {
    # tests/unit_tests/test_auto_placement.py, get_mock_config_reasoning (128 GPUs, TP 2 actor/inference)
    "rlinf test reasoning": {"task_type": "reasoning", "total_gpus": 128, "group_size": 16, "n_minibatches": 4,
                             "rollout_batch_size": 512, "max_running_requests": 128, "recompute_logprobs": True,
                             "components": ["actor", "rollout", "inference"],
                             "model_parallel": {"actor": 2, "inference": 2},
                             "actor_cost": 101, "rollout_cost": 224, "inference_cost": 10},
    # tests/e2e_tests/auto_placement/qwen2.5-1.5b-grpo.yaml (actor TP 2; inference from the actor);
    # the GPU count is not in the file (its CI machine's): 8 here
    "rlinf e2e qwen2.5-1.5b": {"task_type": "reasoning", "total_gpus": 8, "group_size": 16, "n_minibatches": 4,
                               "rollout_batch_size": 128, "max_running_requests": 64, "recompute_logprobs": True,
                               "components": ["actor", "rollout"], "model_parallel": {"actor": 2},
                               "actor_cost": 95.7, "inference_cost": 30.8, "rollout_cost": 59.9},
    # get_mock_config_embodiment("libero") and ("maniskill"), 4 GPUs
    "rlinf test libero": {"task_type": "embodied", "total_gpus": 4, "env_num": 64, "actor_cost": 100,
                          "env_profile_data": {4: 0.61, 8: 1.23, 16: 2.46, 32: 4.66, 64: 18.5},
                          "rollout_profile_data": {4: 0.6, 8: 1.01, 16: 2.12, 32: 3.72, 64: 15.3}},
    "rlinf test maniskill": {"task_type": "embodied", "total_gpus": 4, "env_num": 40, "actor_cost": 100,
                             "env_profile_data": {10: 0.8, 20: 0.8, 30: 0.85, 40: 0.85},
                             "rollout_profile_data": {10: 0.4, 20: 0.6, 30: 0.85, 40: 1.15}},
}


RLINF_STEPS = {"rlinf test libero": 512, "rlinf test maniskill": 80}
"""Env steps per rollout epoch, which the planner's input does not give: RLinf's LIBERO-10 and ManiSkill
put-on-plate env configs (``max_steps_per_rollout_epoch``)."""


def from_rlinf(name: str) -> Scenario:
    """Our cost model from one of the planner's own inputs (a single collocated measurement each)."""
    rl = dict(RLINF_OWN[name])
    n = rl["total_gpus"]
    if rl["task_type"] == "reasoning":
        prompts, group = rl["rollout_batch_size"], rl["group_size"]
        items = prompts * group
        lin = {c: ComponentCost(c=rl[f"{c}_cost"] * n / items) for c in ("rollout", "inference", "actor")}
        cost = CostModel({**lin, "reward": ComponentCost()})
        chunks = tuple(sorted({max(1, prompts // k) for k in (1, 4, 16, 64)}))
        space = SearchSpace(GRPO_GRAPH, GRPO, ("rollout", "reward", "inference", "actor"),
                            {"prompts": prompts, "group": group, "chunk": prompts}, varied={"chunk": chunks},
                            fusions=(("reward", "rollout"),))
        notes = ["ours: each component linear in items per device from its one collocated figure; reward free; "
                 "no memory limit (the input gives none); our search does not impose the TP-2 even device counts"]
        return Scenario(name, "reasoning", n, space, cost, rl, notes, "chunk", (prompts, 1))
    env_num, steps = rl["env_num"], RLINF_STEPS[name]
    # its figures are seconds per iteration (a rollout epoch): per step, 1/steps of them
    fits = {c: fit_component([(k, 1, v / steps) for k, v in rl[f"{key}_profile_data"].items()])
            for c, key in (("env", "env"), ("rollout", "rollout"))}
    cost = CostModel({"env": fits["env"].cost, "rollout": fits["rollout"].cost,
                      "actor": ComponentCost(c=rl["actor_cost"] * n / (env_num * steps))})
    space = SearchSpace(PPO_GRAPH, replace(PPO, items_per_rank_of=""), ("env", "rollout", "actor"),
                        {"envs": env_num, "steps": steps, "stages": 1}, varied={"stages": (1, 2, 4)},
                        fusions=(("rollout", "env"),))
    notes = [f"ours: {steps} loop steps per iteration; env fitted a + c*envs (fit error {fits['env'].error:.0%}), "
             f"policy likewise ({fits['rollout'].error:.0%}); actor linear from its collocated figure"]
    return Scenario(name, "embodied", n, space, cost, rl, notes, "stages", (1, 2))
