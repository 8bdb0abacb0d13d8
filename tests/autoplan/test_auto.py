"""``m2flow profile`` and ``placement: auto``: profiles through the real workers, chooses, runs, re-plans."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from m2flow.cli import main
from m2flow.planner.drift import SwitchDecision
from m2flow.planner.profile_file import load_profile
from m2flow.autoplan import auto
from m2flow.autoplan import selection
from m2flow.autoplan import replan
from m2flow.autoplan.plan_context import PlanContext
from m2flow.autoplan.entry import train
from m2flow.workflows.reasoning.workflow import WORKFLOW as REASONING
from m2flow.driver.registry import get_workflow, load_workflow_config
from tests.workflows.embodied import setup as embodied_setup

TINY = {
    "workflow": "reasoning",
    "placement": "auto",
    "cluster": {"cpu_devices_per_node": 1},
    "auto": {"profile_iterations": 2, "drift_window": 2},
    "model": {"create_tiny": True, "tiny": {"hidden_size": 32, "intermediate_size": 64, "seed": 1}},
    "data": {"prompts_per_step": 8, "arithmetic": {"train_size": 64, "test_size": 16}},
    "rollout": {"sampling": {"n": 4, "max_new_tokens": 6}},
    "reward": {"fn": "tests.workflows.toy_reward:target_fraction"},
    "actor": {"optim": {"lr": 0.02}, "micro_batch_size": 16},
    "steps": 6,
    "checkpoint_every": 2,
    "metrics": {"sinks": ["jsonl"]},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny config as a file, and its profile written by `m2flow profile`."""
    root = tmp_path_factory.mktemp("auto")
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "model": {**TINY["model"], "path": str(root / "model")},
                                      "run_dir": str(root / "run")}))
    out = root / "profile.json"
    assert main(["profile", str(config), "--out", str(out), "--repeats", "2"]) == 0
    return config, out


def _cfg(config: Path, *overrides: str):
    return load_workflow_config(config, list(overrides))[1]


def test_profile_round_trip(tiny, capsys) -> None:
    config, out = tiny
    profile = json.loads(out.read_text())
    assert set(profile["components"]) == {"rollout", "reward", "inference", "actor"}
    for name, entry in profile["components"].items():
        sizes = sorted(p[0] for p in entry["points"])
        assert sizes == [8, 16, 32], name  # 2, 4, 8 prompts x 4 responses, one call each
        # (items, devices, seconds, threads of the process that measured it: the config's one thread)
        assert all(p[1] == 1 and p[2] > 0 and p[3] == 1 for p in entry["points"])
        assert 0 <= entry["fit_error"] < 1 and entry["startup_s"] > 0
    assert profile["components"]["actor"]["state_bytes"] > profile["components"]["rollout"]["state_bytes"] > 0
    assert profile["edge_bytes"]["responses"] > 0 and len(profile["probes"]) == 4
    # Each probe ran twice in rotation; the profile keeps its faster run.
    for probe in profile["probes"]:
        assert len(probe["repeats_s"]) == 2 and probe["iteration_s"] == min(probe["repeats_s"])
    # The unfused probe in the driver prices a hand-off between rank threads (one device: no Ray probe).
    assert profile["link"]["measured"] == "local" and 0 <= profile["link"]["local_latency"] < 1
    spec, cfg = load_workflow_config(config)
    cost = load_profile(out, "reasoning", PlanContext(spec, cfg).config_hash())
    assert cost.component("actor").time(32, 1) == pytest.approx(
        [p for p in profile["components"]["actor"]["points"] if p[0] == 32][0][2], rel=0.5)
    assert main(["plan", "search", str(config), "--profile", str(out), "--top", "1"]) == 0
    assert "1. " in capsys.readouterr().out


def test_profile_refuses_a_repeat_count_below_one(tiny, capsys) -> None:
    config, _ = tiny
    assert main(["profile", str(config), "--repeats", "0"]) == 1
    assert "--repeats must be at least 1" in capsys.readouterr().err


def test_profile_refuses_an_unwritable_out_at_once(tiny, tmp_path, capsys) -> None:
    config, _ = tiny
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["profile", str(config), "--out", str(blocker / "profile.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot write the profile to") and "file" in err[0]
    assert main(["profile", str(config), "--iterations", "1"]) == 1
    assert "--iterations must be at least 2" in capsys.readouterr().err


def test_auto_reasoning_runs_the_chosen_plan_and_reuses_its_profile(tiny, tmp_path, caplog) -> None:
    config, profile = tiny
    caplog.set_level(logging.INFO, logger="m2flow")
    run_dir = tmp_path / "run"
    result = train(REASONING, _cfg(config, f"run_dir={run_dir}", f"auto.profile={profile}", "auto.replan=false"))
    assert [int(h["rollout/responses_count"]) for h in result.history] == [32] * 6  # nothing lost or repeated
    record = json.loads((run_dir / "auto.json").read_text())
    assert record["chosen"]["seconds_per_iteration"] > 0 and record["runs_with"]["placement"] == "local"
    assert json.loads((run_dir / "plan.json").read_text())["placement"] == "local"  # one device: no Ray
    assert f"using the profile {profile}" in caplog.text and "auto: chose a collocated plan" in caplog.text


def test_a_stale_profile_is_refused_and_made_again(tiny, tmp_path, caplog) -> None:
    config, profile = tiny
    copy = tmp_path / "profile.json"
    copy.write_text(profile.read_text())
    caplog.set_level(logging.INFO, logger="m2flow")
    spec = get_workflow("reasoning")
    choice = auto.resolve(spec, _cfg(config, f"run_dir={tmp_path / 'run'}", f"auto.profile={copy}",
                                     "data.prompts_per_step=4"))
    assert "is stale" in caplog.text and "profiling again" in caplog.text
    fresh = json.loads(copy.read_text())
    assert fresh["config_hash"] == choice.ctx.config_hash() != json.loads(profile.read_text())["config_hash"]
    foreign = {**fresh, "machine": {**fresh["machine"], "hostname": "elsewhere"}}
    copy.write_text(json.dumps(foreign))
    caplog.clear()
    auto.resolve(spec, _cfg(config, f"run_dir={tmp_path / 'run'}", f"auto.profile={copy}", "data.prompts_per_step=4"))
    assert "is foreign" in caplog.text and "'elsewhere'" in caplog.text


def test_drift_replans_at_a_checkpoint_and_resumes_under_the_new_plan(tiny, tmp_path, monkeypatch, caplog) -> None:
    config, profile = tiny
    # The profile says the actor is 20x faster than it is: a sustained drift from the first iterations.
    tampered = json.loads(profile.read_text())
    tampered["components"]["actor"]["points"] = [[p[0], p[1], p[2] / 20, *p[3:]]
                                                   for p in tampered["components"]["actor"]["points"]]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(tampered))
    # Force the decision (the gain of one tiny plan over another is noise) and exclude the running plan
    # from the re-search, so the switch itself is what is tested: stop at a checkpoint, resume elsewhere.
    monkeypatch.setattr(replan, "worth_switching", lambda *a: SwitchDecision(True, 1.0, 0.0))
    real, first = selection.choose, []

    def choose(ctx, cost, profile=None, keep=lambda c: True):
        if not first:  # the initial choice
            choice = real(ctx, cost, profile, keep)
            first.append(choice.best.choice)
            return choice
        return real(ctx, cost, profile, lambda c: keep(c) and c.choice != first[0])

    monkeypatch.setattr(selection, "choose", choose)
    caplog.set_level(logging.INFO, logger="m2flow")
    run_dir = tmp_path / "run"
    result = train(REASONING, _cfg(config, f"run_dir={run_dir}", f"auto.profile={path}", "auto.max_replans=1"))
    assert "auto: drift at iteration" in caplog.text and "actor took" in caplog.text
    record = json.loads((run_dir / "auto.json").read_text())
    switch = record["replans"][0]
    assert switch["switched"] and switch["ratios"]["actor"] > 1.5 and switch["best"] != record["chosen"]["overrides"]
    assert (switch["iteration"] + 1) % 2 == 0  # at a checkpoint boundary
    rows = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4, 5, 6]  # resumed exactly where it stopped: nothing lost or repeated
    assert len(result.history) == 6 and "restarting from the newest checkpoint" in caplog.text


def test_auto_embodied_end_to_end(tmp_path, caplog) -> None:
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED

    caplog.set_level(logging.INFO, logger="m2flow")
    cfg = embodied_setup.toy_config(tmp_path, placement="auto", **{
        "cluster.cpu_devices_per_node": 1, "auto.profile_iterations": 2, "total_env_steps": 3 * 512,
        "rollout_steps": 64})
    result = train(EMBODIED, cfg)
    assert len(result.history) == 3 and result.history[-1]["env/total_steps"] == 3 * 512
    profile = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert set(profile["components"]) == {"env", "rollout", "actor"}
    assert {p[0] for p in profile["components"]["env"]["points"]} == {8, 4, 2}  # 1, 2, 4 stages of 8 envs
    record = json.loads((tmp_path / "run" / "auto.json").read_text())
    assert record["runs_with"]["placement"] == "local" and "auto: chose a" in caplog.text


@pytest.mark.ray
def test_profile_measures_two_ranks_under_ray(cluster, tmp_path) -> None:
    import os

    from m2flow.autoplan.probes import Profiler

    if (os.cpu_count() or 1) < 2:
        pytest.skip("two ranks of one thread need two cores to be measured without contention")

    cfg = embodied_setup.toy_config(tmp_path, placement="auto", **{"cluster.cpu_devices_per_node": 2,
                                                                  "rollout_steps": 64})
    ctx = PlanContext(get_workflow("embodied"), cfg)
    lines: list[str] = []
    profile = Profiler(ctx, iterations=2, work_dir=tmp_path / "work", say=lines.append).run(tmp_path / "p.json")
    for name in ("env", "rollout", "actor"):
        ranks = {p[1] for p in profile["components"][name]["points"]}
        assert ranks == {1, 2}, (name, profile["components"][name]["points"])
    assert any("2 rank(s)" in line for line in lines)
    link = profile["link"]
    assert link["measured"].endswith("local and remote and dispatch")
    assert all(0 <= link[k] < 1 for k in ("latency", "local_latency", "dispatch"))
    assert any(line.startswith("profile: a message costs") for line in lines)
    cost = load_profile(tmp_path / "p.json", "embodied", ctx.config_hash())
    assert cost.component("actor").time(1024, 2) > 0


def test_auto_settings_and_the_runtime_parser_refuse_bad_input(tiny) -> None:
    from m2flow.config.errors import ConfigError
    from m2flow.runtime.placement import NodeLayout, PlacementError, parse_placement

    config, _ = tiny
    with pytest.raises(ConfigError, match=r"auto.drift_window: must be >= 1"):
        _cfg(config, "auto.drift_window=0")
    with pytest.raises(ConfigError, match=r"auto.profile_iterations: must be >= 2"):
        _cfg(config, "auto.profile_iterations=1")
    assert _cfg(config).placement == "auto"  # the config accepts it; the runtime does not place it
    with pytest.raises(PlacementError, match="chosen by the planner before a run starts"):
        parse_placement("auto", NodeLayout((2,)), ("rollout", "actor"))
