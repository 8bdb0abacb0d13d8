"""The warm-start directory every workflow shares: kept whole or not at all, reused only under the same
settings, a named file entering the settings by the digest of its bytes."""

from __future__ import annotations

import json

import pytest

from m2flow.config.errors import InputError
from m2flow.workflows.warm_start_dir import SETTINGS_FILE, WARM_START_DIR, file_digest, keep, reusable


def test_a_kept_warm_start_is_reused_under_its_own_settings_only(tmp_path):
    path = keep(tmp_path, {"lr": 1e-3, "steps": 2}, lambda d: (d / "weights.bin").write_bytes(b"w"))
    assert path == tmp_path / WARM_START_DIR and (path / "weights.bin").read_bytes() == b"w"
    assert json.loads((path / SETTINGS_FILE).read_text()) == {"lr": 1e-3, "steps": 2}
    assert reusable(tmp_path, {"steps": 2, "lr": 1e-3}) == path
    assert reusable(tmp_path, {"lr": 1e-2, "steps": 2}) is None
    assert reusable(tmp_path, {"lr": 1e-3, "steps": 2}, needs="weights.bin") == path
    assert reusable(tmp_path, {"lr": 1e-3, "steps": 2}, needs="policy.pt") is None
    assert reusable(tmp_path / "elsewhere", {"lr": 1e-3, "steps": 2}) is None


def test_a_warm_start_that_fails_while_written_leaves_the_earlier_one_and_no_settings(tmp_path):
    first = keep(tmp_path, {"v": 1}, lambda d: (d / "weights.bin").write_bytes(b"1"))

    def crash(d):
        (d / "weights.bin").write_bytes(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        keep(tmp_path, {"v": 2}, crash)
    assert reusable(tmp_path, {"v": 1}) == first and (first / "weights.bin").read_bytes() == b"1"
    assert reusable(tmp_path, {"v": 2}) is None
    assert not (tmp_path / (WARM_START_DIR + ".partial") / SETTINGS_FILE).exists()


def test_the_digest_follows_the_content_and_a_missing_file_names_the_key(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("x")
    b.write_text("x")
    assert file_digest(a, "k") == file_digest(b, "k")
    b.write_text("y")
    assert file_digest(a, "k") != file_digest(b, "k")
    with pytest.raises(InputError, match=r"^model.warm_start.file: cannot read .*missing.jsonl"):
        file_digest(tmp_path / "missing.jsonl", "model.warm_start.file")
