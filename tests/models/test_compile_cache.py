"""Each CPU float path compiles into a cache directory of its own, unless the user named one."""

from __future__ import annotations

import os

import torch

from m2flow.models.compile_cache import cache_per_float_path


def test_the_compile_cache_is_this_float_paths_own(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that the end of the test restores what was there
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    cache_per_float_path()
    path = torch.backends.cpu.get_cpu_capability().lower()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith(f"_{path}")


def test_torchs_own_default_in_the_environment_is_not_taken_for_a_choice(monkeypatch):
    from m2flow.models.compile_cache import _torch_default

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", _torch_default())  # what torch writes there on first use
    cache_per_float_path()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == f"{_torch_default()}_{torch.backends.cpu.get_cpu_capability().lower()}"


def test_a_cache_directory_the_user_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    cache_per_float_path()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
