"""Env tests run in a temporary working directory: MuJoCo may write MUJOCO_LOG.TXT into the cwd."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _tmp_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
