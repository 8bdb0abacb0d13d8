"""Metric sinks: JSON lines content, a TensorBoard event file, W&B skipped cleanly, console line."""

from __future__ import annotations

import io
import json
import math
import sys

from m2flow.metrics import ConsoleSink, JsonlSink, TensorBoardSink, WandbSink


def test_jsonl_one_line_per_step_with_step_time_and_values(tmp_path):
    sink = JsonlSink(tmp_path)
    sink.write(0, {"actor/loss": 0.5, "time/step": 2})
    sink.write(1, {"actor/loss": math.nan})
    sink.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(isinstance(r["time"], float) for r in rows)
    assert {k: v for k, v in rows[0].items() if k != "time"} == {"step": 0, "actor/loss": 0.5, "time/step": 2}
    assert rows[1]["actor/loss"] is None  # NaN is not JSON


def test_jsonl_appends_on_resume(tmp_path):
    for step in (0, 1):
        sink = JsonlSink(tmp_path)
        sink.write(step, {"reward/mean": float(step)})
        sink.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(0, 0.0), (1, 1.0)]


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path)
    for step in range(3):
        sink.write(step, {"actor/loss": 1.0 / (step + 1), "env/return": 10.0 * step})
    sink.close()
    files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["actor/loss", "env/return"]
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("actor/loss")] == [
        (0, 1.0), (1, 0.5), (2, 0.333333)]
    assert [e.value for e in acc.Scalars("env/return")] == [0.0, 10.0, 20.0]


def test_wandb_sink_is_skipped_when_wandb_is_missing(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with caplog.at_level("INFO", logger="m2flow.metrics.sinks"):
        assert WandbSink.create(tmp_path, "proj") is None
    assert "wandb is not installed" in caplog.text


def test_wandb_sink_forwards_steps_to_the_run():
    class Run:
        def __init__(self) -> None:
            self.logged, self.finished = [], False

        def log(self, data, step):
            self.logged.append((step, data))

        def finish(self):
            self.finished = True

    run = Run()
    sink = WandbSink(run)
    sink.write(4, {"reward/mean": 0.5})
    sink.close()
    assert run.logged == [(4, {"reward/mean": 0.5})] and run.finished


def test_console_shows_progress_and_key_metrics():
    from rich.console import Console

    buf = io.StringIO()
    sink = ConsoleSink(total_steps=4, description="grpo", key_metrics=["reward/mean"],
                       console=Console(file=buf, width=200, force_terminal=False))
    assert sink.shown({"reward/mean": 0.123456, "actor/loss": 2.0}) == "reward/mean=0.1235"
    sink.write(0, {"reward/mean": 0.25, "actor/loss": 1.0})
    sink.write(1, {"reward/mean": 0.5, "actor/loss": 1.0})
    sink.close()
    out = buf.getvalue()
    assert "grpo" in out and "2/4" in out and "reward/mean=0.5" in out and "actor/loss" not in out


def test_console_defaults_to_the_first_metrics_logged():
    sink = ConsoleSink(total_steps=None, max_shown=2, console=None)
    assert sink.shown({"a/x": 1, "a/y": 2.0, "a/z": 3}) == "a/x=1  a/y=2"
    sink.close()
