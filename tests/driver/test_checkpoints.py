"""Run scaffolding: the trainer state is JSON written atomically, resume=auto falls back past torn markers."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from m2flow.driver.checkpoints import TRAINER_STATE, CheckpointError, checkpoint_path, find_checkpoint, prune_checkpoints, read_state, truncate_metrics, write_state
from m2flow.driver.scaffold import RunScaffold
from m2flow.runtime.cluster import ClusterConfig


def _checkpoint(run_dir, step: int, **extra) -> None:
    path = checkpoint_path(run_dir, step)
    path.mkdir(parents=True)
    write_state(path, {"next_step": step, **extra})


def test_state_round_trips_exactly_arrays_included(tmp_path):
    rng = np.random.default_rng(0)
    state = {"next_step": 3, "deltas": [{"mean": rng.normal(size=(3, 2)), "count": np.float64(7.5)}],
             "f32": rng.normal(size=4).astype(np.float32), "episodes": [(10, 1.25)]}
    path = tmp_path / "c"
    path.mkdir()
    write_state(path, state)
    back = read_state(path)
    assert np.array_equal(back["deltas"][0]["mean"], state["deltas"][0]["mean"])
    assert back["f32"].dtype == np.float32 and np.array_equal(back["f32"], state["f32"])
    assert back["deltas"][0]["count"] == 7.5 and back["episodes"] == [[10, 1.25]]
    assert not list(path.glob("*.tmp"))  # the temporary file was renamed into place


def test_state_refuses_what_json_cannot_hold(tmp_path):
    with pytest.raises(TypeError, match="cannot store object"):
        write_state(tmp_path, {"next_step": 1, "x": object()})


def test_auto_resume_takes_the_newest_valid_checkpoint_and_says_what_it_skipped(tmp_path, caplog):
    for step in (2, 4):
        _checkpoint(tmp_path, step)
    torn = checkpoint_path(tmp_path, 6)
    torn.mkdir(parents=True)
    (torn / TRAINER_STATE).write_text('{"next_st')  # a marker cut short
    checkpoint_path(tmp_path, 8).mkdir(parents=True)  # the workers saved, the marker never came
    empty = checkpoint_path(tmp_path, 10)
    empty.mkdir(parents=True)
    (empty / TRAINER_STATE).write_text("")
    with caplog.at_level(logging.WARNING):
        assert find_checkpoint("auto", tmp_path) == checkpoint_path(tmp_path, 4)
    skipped = " ".join(r.getMessage() for r in caplog.records)
    for step in ("step_000006", "step_000008", "step_000010"):
        assert step in skipped


def test_no_checkpoint_yet_and_no_resume():
    assert find_checkpoint(None, "/nonexistent") is None


def test_auto_with_no_checkpoints_starts_fresh(tmp_path):
    assert find_checkpoint("auto", tmp_path) is None


@pytest.mark.parametrize("content, words", [(None, "is not a checkpoint"), ("[1, 2", "unreadable trainer state"),
                                            ('{"step": 1}', "no 'next_step'")])
def test_an_explicit_bad_checkpoint_is_named(tmp_path, content, words):
    path = tmp_path / "ckpt"
    path.mkdir()
    if content is not None:
        (path / TRAINER_STATE).write_text(content)
    with pytest.raises(CheckpointError, match=words) as info:
        find_checkpoint(str(path), tmp_path)
    assert str(path) in str(info.value)


def test_a_failing_run_keeps_its_own_error_when_the_trace_cannot_merge(tmp_path):
    scaffold = RunScaffold(tmp_path, executor="ray", cluster_config=ClusterConfig(), trace=True)
    with pytest.raises(RuntimeError, match="the run's own error"):
        with scaffold:
            for shard in (tmp_path / "trace").glob("*"):
                shard.unlink()
            raise RuntimeError("the run's own error")


def test_resume_drops_the_metric_rows_logged_after_the_checkpoint(tmp_path):
    rows = [f'{{"step": {s}, "x": {s}}}' for s in (1, 2, 3, 4)] + ['{"step": 5, "x"']  # last one torn
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    assert truncate_metrics(tmp_path, 2) == 3
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == rows[:2]
    assert truncate_metrics(tmp_path, 2) == 0


def _with_weights(run_dir, step: int) -> None:
    path = checkpoint_path(run_dir, step)
    (path / "actor").mkdir(parents=True)
    (path / "actor" / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    write_state(path, {"next_step": step})


def test_a_corrupted_or_missing_weights_file_is_named_and_auto_resume_falls_back(tmp_path, caplog):
    for step in (2, 4, 6):
        _with_weights(tmp_path, step)
    flipped = checkpoint_path(tmp_path, 6) / "actor" / "model.safetensors"
    data = bytearray(flipped.read_bytes())
    data[100] ^= 0xFF
    flipped.write_bytes(bytes(data))
    (checkpoint_path(tmp_path, 4) / "actor" / "model.safetensors").unlink()
    with caplog.at_level(logging.WARNING):
        assert find_checkpoint("auto", tmp_path) == checkpoint_path(tmp_path, 2)
    text = " ".join(r.getMessage() for r in caplog.records)
    assert f"{flipped}: corrupted" in text and "model.safetensors: missing" in text
    with pytest.raises(CheckpointError, match="corrupted"):
        find_checkpoint(str(checkpoint_path(tmp_path, 6)), tmp_path)


def test_keep_checkpoints_removes_the_oldest_complete_ones(tmp_path):
    for step in (1, 2, 3, 4):
        _with_weights(tmp_path, step)
    torn = checkpoint_path(tmp_path, 5)
    torn.mkdir()
    removed = prune_checkpoints(tmp_path, 2)
    assert removed == [checkpoint_path(tmp_path, 1), checkpoint_path(tmp_path, 2)]
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["step_000003", "step_000004", "step_000005"]  # the incomplete one is not ours to judge
    assert prune_checkpoints(tmp_path, None) == []
