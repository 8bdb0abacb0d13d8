"""`m2flow plan search`: refuses without a profile or with a stale one; ranks plans the plan function accepts."""

from __future__ import annotations

import json
import shlex

import pytest

from m2flow.cli import main

REASONING = "examples/reasoning/arithmetic_grpo.yaml"
EMBODIED = "examples/embodied/cartpole_pipelined.yaml"
AGENTIC = "examples/agentic/calculator_grpo.yaml"


def _points(a: float, c: float) -> list[list[float]]:
    return [[b, d, a + c * b / d ** 0.8] for b in (8, 32) for d in (1, 2)]


def _profile(tmp_path, capsys, config: str, costs: dict[str, tuple[float, float]], *overrides: str,
             cores: int | None = 2):
    path = tmp_path / "profile.json"
    assert main(["plan", "profile-template", config, str(path), *overrides]) == 0
    capsys.readouterr()
    profile = json.loads(path.read_text())
    assert set(profile["components"]) == set(costs)
    for name, (a, c) in costs.items():
        profile["components"][name].update(points=_points(a, c), mem_fixed=1e8, state_bytes=1e7)
    profile["device"] = {"memory_bytes": 8 * 2**30, "cores": cores}
    path.write_text(json.dumps(profile))
    return path


def test_search_refuses_without_a_profile(capsys):
    assert main(["plan", "search", REASONING]) != 0
    assert "profile-template" in capsys.readouterr().err


def test_reasoning_search_ranks_plans_that_the_plan_function_builds(tmp_path, capsys):
    path = _profile(tmp_path, capsys, REASONING, {"rollout": (0.05, 0.02), "reward": (0.001, 0.0005),
                                                  "actor": (0.05, 0.015)})
    assert main(["plan", "search", REASONING, "--profile", str(path), "--devices", "2", "--top", "3",
                 "--trace", str(tmp_path / "sim")]) == 0
    out = capsys.readouterr().out
    assert "candidates (every device split)" in out and "bottleneck" in out and "1. " in out and "3. " in out
    assert (tmp_path / "sim" / "trace.json").exists()
    use = [line for line in out.splitlines() if line.strip().startswith("use:")][0].split("use:")[1]
    # The overrides printed are a valid plan of the config.
    assert main(["plan", "show", REASONING, "cluster.cpu_devices_per_node=2", *shlex.split(use)]) == 0


def test_a_stale_profile_is_refused(tmp_path, capsys):
    path = _profile(tmp_path, capsys, REASONING, {"rollout": (0.05, 0.02), "reward": (0.001, 0.0005),
                                                  "actor": (0.05, 0.015)})
    assert main(["plan", "search", REASONING, "--profile", str(path), "data.prompts_per_step=4"]) != 0
    assert "is stale: taken on a config with hash" in capsys.readouterr().err


@pytest.mark.parametrize("env_cost", [0.2, 0.001])
def test_embodied_search_runs(tmp_path, capsys, env_cost):
    path = _profile(tmp_path, capsys, EMBODIED, {"env": (0.001, env_cost), "rollout": (0.002, 0.001),
                                                 "actor": (0.05, 0.001)})
    assert main(["plan", "search", EMBODIED, "--profile", str(path), "--devices", "2", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "1. " in out and "pipeline_stages=" in out and "rollout.fuse_with_env=" in out


def test_above_the_exhaustive_range_every_plan_shown_is_valid_and_the_choice_does_not_depend_on_top(tmp_path, capsys):
    # 32 GPU-like devices, minibatches of 16: plans of more than 16 actor ranks fail the config's own validation.
    small = ["algorithm.minibatch_size=16", "rollout_steps=16"]
    path = _profile(tmp_path, capsys, EMBODIED, {"env": (0.001, 0.2), "rollout": (0.002, 0.001),
                                                 "actor": (0.05, 0.001)}, *small, cores=None)
    firsts, uses = [], []
    for top in ("1", "4"):
        assert main(["plan", "search", EMBODIED, "--profile", str(path), "--devices", "32", "--top", top, *small]) == 0
        out = capsys.readouterr().out
        lines = [line.split("use:")[1] for line in out.splitlines() if line.strip().startswith("use:")]
        firsts.append(lines[0])
        uses += lines
    assert firsts[0] == firsts[1] and len(uses) == 5
    assert "rejected" in out and "fastest rejected" in out and "must be at least the number of actor ranks" in out
    for use in uses:  # each is a plan the config accepts
        assert main(["plan", "show", EMBODIED, "cluster.cpu_devices_per_node=32", *small, *shlex.split(use)]) == 0


@pytest.mark.parametrize("config, costs, tunable", [
    (REASONING, {"rollout": (0.05, 0.02), "reward": (0.001, 0.0005), "actor": (0.05, 0.015)},
     "rollout.prompts_per_chunk"),
    (EMBODIED, {"env": (0.001, 0.2), "rollout": (0.002, 0.001), "actor": (0.05, 0.001)}, "pipeline_stages")])
def test_each_ranked_plan_is_its_choice_as_the_workflow_builds_it(tmp_path, capsys, config, costs, tunable):
    from pathlib import Path

    from m2flow.autoplan.plan_context import PlanContext
    from m2flow.config import with_overrides
    from m2flow.driver.registry import load_workflow_config
    from m2flow.planner.profile_file import load_profile
    from m2flow.planner.search import search
    from m2flow.runtime.placement import NodeLayout

    path = _profile(tmp_path, capsys, config, costs)
    spec, cfg = load_workflow_config(Path(config), ["cluster.cpu_devices_per_node=2"])
    ctx = PlanContext(spec, cfg, NodeLayout((2,)))
    result = search(ctx.space, load_profile(path, spec.name, ctx.config_hash()), 2, top=12, build_plan=ctx.build)
    assert len(result.ranked) > 3
    varied = set(ctx.space.varied)
    assert varied and varied <= set(ctx.base.settings)  # the search varies settings the Plan itself has
    for cand in result.ranked:
        # What the search chose is what the built Plan holds, and the config the workflow makes of it
        # plans the same Plan again.
        assert cand.choice.values.items() <= cand.plan.settings.items()
        assert cand.plan.placement == cand.choice.placement and set(cand.choice.values) == varied
        assert ctx.build(cand.choice) == cand.plan
    # The keys the workflow translates a choice to are execution keys: a profile outlives them.
    other = with_overrides(spec.schema, ctx.cfg, {tunable: ctx.space.varied[varied.pop()][0]})
    assert PlanContext(spec, other, NodeLayout((2,))).config_hash() == ctx.config_hash()


def test_planning_a_config_imports_neither_ray_nor_the_workflows_flow():
    """`m2flow plan search` loads a config and builds its Plans: the runtime's Ray side and the live flow
    (workers, models) are imported when a run launches, not to plan one."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from m2flow.autoplan.plan_context import PlanContext\n"
            "from m2flow.driver.registry import load_workflow_config\n"
            f"for path in {[REASONING, EMBODIED]!r}:\n"
            "    spec, cfg = load_workflow_config(path)\n"
            "    PlanContext(spec, cfg)\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.endswith('.flow')))\n")
    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_plan_search_command_imports_neither_torch_nor_transformers(tmp_path, capsys):
    """`m2flow plan search` validates a config (backend, strategy, policy, estimator and env names) and
    searches without torch's and transformers' seconds of import, for every workflow shape."""
    import subprocess
    import sys

    shapes = {REASONING: {"rollout": (0.05, 0.02), "reward": (0.001, 0.0005), "actor": (0.05, 0.015)},
              EMBODIED: {"env": (0.001, 0.2), "rollout": (0.002, 0.001), "actor": (0.05, 0.001)},
              AGENTIC: {"env": (0.01, 0.001), "rollout": (0.05, 0.02), "actor": (0.05, 0.015)}}
    commands = []
    for i, (config, costs) in enumerate(shapes.items()):
        (tmp_path / str(i)).mkdir()
        profile = _profile(tmp_path / str(i), capsys, config, costs)
        commands.append(["plan", "search", config, "--profile", str(profile), "--devices", "4", "--top", "1"])
    # Each command in turn in one fresh process, the heavy modules loaded so far listed after each.
    code = ("import json, sys\n"
            "from m2flow.cli import main\n"
            "loaded = {}\n"
            f"for argv in {commands!r}:\n"
            "    assert main(argv) == 0, argv\n"
            "    loaded[argv[2]] = sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules)\n"
            "print(json.dumps(loaded))\n")
    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    # CUDA_VISIBLE_DEVICES empty: on a machine with GPUs, counting them (the config's device layout) is torch's.
    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {config: [] for config in shapes}, loaded


def test_a_search_with_partial_rollouts_says_how_they_were_priced(tmp_path, capsys):
    partial = ["rollout.partial=true", "rollout.backend=lean", "algorithm.max_staleness=2",
               "algorithm.old_logprobs=rollout"]
    path = _profile(tmp_path, capsys, REASONING, {"rollout": (0.05, 0.02), "reward": (0.001, 0.0005),
                                                  "actor": (0.05, 0.015)}, *partial)
    assert main(["plan", "search", REASONING, "--profile", str(path), "--devices", "2", *partial]) == 0
    notes = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("note:")]
    assert any("generates 1 iteration(s) ahead, not 2" in n for n in notes)
    assert any("generation priced as the profile measured it" in n for n in notes)
    # The same profile is not one of the config without partial rollouts: its probes ran them.
    assert main(["plan", "search", REASONING, "--profile", str(path), *partial[1:]]) != 0
    assert "is stale" in capsys.readouterr().err
