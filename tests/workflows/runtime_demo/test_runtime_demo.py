"""The runtime demo (`m2flow train examples/runtime_demo.yaml`) runs end to end on the shared cluster and writes one log per worker."""

import re
from pathlib import Path

import pytest

from m2flow.config.errors import ConfigError
from m2flow.workflows.runtime_demo.workflow import RuntimeDemoConfig, run_runtime_demo, run_runtime_demo_config

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "runtime_demo.yaml"


def test_demo_runs_and_logs_per_worker(cluster, tmp_path, capsys):
    cfg = RuntimeDemoConfig(steps=3, batch_size=256, run_dir=str(tmp_path / "run"))
    assert run_runtime_demo_config(cfg) == 0
    # One log per worker, named by its group (the component and the run's id) and rank.
    logs = sorted(p.name for p in (tmp_path / "run" / "logs").iterdir())
    assert [re.sub(r"-[0-9a-f]{8}\.", ".", name) for name in logs] == \
        [f"{g}.{r}.log" for g in ("producer", "reducer", "scaler") for r in (0, 1)]
    assert "batch 2" in (tmp_path / "run" / "logs" / logs[0]).read_text()
    out = capsys.readouterr().out
    assert "moved 1536 numbers" in out  # 3 steps x 256 numbers x 2 producer ranks


def test_demo_rejects_bad_placement_before_starting():
    with pytest.raises(ConfigError, match="steps"):
        run_runtime_demo(["steps=0"])


def test_impossible_placement_fails_naming_the_key(capsys):
    from m2flow.cli import main

    # Quoted: `m2flow train` reads every override as YAML before it knows the schema.
    assert main(["train", str(EXAMPLE), 'placement="producer: 0-9, scaler,reducer: 2-3"']) == 2
    err = capsys.readouterr().err
    assert "placement" in err and "device 9" in err and "0-7 exist" in err
    assert main(["train", str(EXAMPLE), "cluster.cpu_devices_per_node=0"]) == 2
    assert "cluster.cpu_devices_per_node" in capsys.readouterr().err
