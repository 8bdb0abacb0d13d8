"""What the profiler measures of the machine it runs on, beside the probes: the process's peak memory,
whether the devices are GPUs, a device's memory and the offload bandwidth."""

from __future__ import annotations

import time
from pathlib import Path


def reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM
    except OSError:
        pass


def peak_rss() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def on_gpus() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def device_memory() -> float | None:
    if on_gpus():
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory)
    return None  # CPU devices are slots on one host's memory: no per-device limit


def offload_bandwidth(nbytes: float) -> float:
    """Bytes per second of moving state between device and host: measured by a copy on GPUs; on CPUs an
    offload moves nothing (``TrainingStrategy.offload``), so it is free."""
    if not on_gpus():
        return 1e15
    import torch

    n = int(max(nbytes, 64 << 20) // 4)
    x = torch.empty(n, dtype=torch.float32, device="cuda")
    host = torch.empty(n, dtype=torch.float32, pin_memory=True)
    host.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        host.copy_(x)
        x.copy_(host)
    torch.cuda.synchronize()
    return 6 * 4 * n / (time.perf_counter() - t0)
