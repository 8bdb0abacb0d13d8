"""MetricsLogger: config validation, fan-out to sinks, name policy, rank-0-only logging."""

from __future__ import annotations

import json

import pytest

from m2flow.metrics import MetricNameError, MetricsConfig, MetricsLogger


class Recorder:
    def __init__(self) -> None:
        self.rows, self.closed = [], False

    def write(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def close(self):
        self.closed = True


def test_config_rejects_unknown_sinks_listing_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown sink\(s\) \['csv'\]; valid: console, jsonl, tensorboard, wandb"):
        MetricsConfig(sinks=["jsonl", "csv"]).validate()
    with pytest.raises(ValueError, match="twice"):
        MetricsConfig(sinks=["jsonl", "jsonl"]).validate()


def test_log_converts_values_and_writes_every_sink(tmp_path):
    import torch

    a, b = Recorder(), Recorder()
    with MetricsLogger(tmp_path, sinks=[a, b], is_main=True) as logger:
        logger.log({"actor/loss": torch.tensor(0.5), "rollout/len": 12}, step=3)
    assert a.rows == b.rows == [(3, {"actor/loss": 0.5, "rollout/len": 12})]
    assert a.closed and b.closed


def test_error_policy_rejects_before_anything_is_written(tmp_path):
    rec = Recorder()
    logger = MetricsLogger(tmp_path, MetricsConfig(unknown_prefix="error"), sinks=[rec], is_main=True)
    with pytest.raises(MetricNameError, match="'loss'"):
        logger.log({"actor/loss": 1.0, "loss": 2.0}, step=0)
    assert rec.rows == []


def test_jsonl_and_tensorboard_files_from_the_config(tmp_path):
    cfg = MetricsConfig(sinks=["jsonl", "tensorboard"])
    with MetricsLogger(tmp_path, cfg, is_main=True) as logger:
        logger.log({"env/return": 1.5}, step=0)
        logger.log({"env/return": 2.5}, step=1)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["env/return"] for r in rows] == [1.5, 2.5]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_only_the_main_process_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    logger = MetricsLogger(tmp_path, MetricsConfig(sinks=["jsonl"]))
    logger.log({"env/return": 1.0}, step=0)
    logger.print("not shown")
    logger.close()
    assert not logger.active and not (tmp_path / "metrics.jsonl").exists()
    monkeypatch.setenv("RANK", "0")
    assert MetricsLogger(tmp_path, MetricsConfig(sinks=[])).active


def test_wandb_in_sinks_is_skipped_cleanly_without_wandb(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    with MetricsLogger(tmp_path, MetricsConfig(sinks=["jsonl", "wandb"]), is_main=True) as logger:
        logger.log({"reward/mean": 1.0}, step=0)
        assert len(logger.sinks) == 1
    assert (tmp_path / "metrics.jsonl").exists()


def test_print_goes_through_the_progress_console(tmp_path, capsys):
    with MetricsLogger(tmp_path, MetricsConfig(sinks=["console"]), total_steps=2, is_main=True) as lg:
        lg.log({"perf/sps": 100.0}, step=0)
    lg.print("all done")
    assert "all done" in capsys.readouterr().out
