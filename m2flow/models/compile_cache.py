"""One ``torch.compile`` cache per CPU float path.

torch runs its CPU kernels on the widest vector instructions the CPU has unless ``ATEN_CPU_CAPABILITY``
forces a narrower path, and inductor builds compiled code for the path in force. Its on-disk cache,
shared by every process of a user, does not tell the paths apart for the C++ wrapper of a compiled
graph: a run forced to AVX2 on an AVX-512 CPU reused what a run on the CPU's own path had built and
computed non-finite losses (an embodied PPO step: NaN in its first updates, then steps that hardly
moved the weights; the same step compiled into an empty cache was exact). So each float path gets a
cache directory of its own, unless the user chose one (``TORCHINDUCTOR_CACHE_DIR``).
"""

from __future__ import annotations

import getpass
import os
import tempfile

import torch


def _torch_default() -> str:
    """The directory torch picks when nobody chose one (and writes into the environment on first use)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return os.path.abspath(default_cache_dir())
    except (ImportError, AttributeError):
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        return os.path.abspath(os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"))


def cache_per_float_path() -> None:
    """Point inductor's cache at this float path's own directory; call before the process compiles.

    A directory the user set is kept; torch's default, which torch itself writes into the environment
    (and a Ray worker inherits from its driver), is not a choice and gets the float path appended."""
    default = _torch_default()
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current and os.path.abspath(current) != default:
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}_{torch.backends.cpu.get_cpu_capability().lower()}"
