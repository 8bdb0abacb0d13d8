"""Shared helpers for the side-by-side benchmarks: peer venvs and processes, A/B rounds, results.

Standard library and numpy only, so peer-side scripts running in another virtual environment can
import it too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
VENVS = BENCH_DIR / ".venvs"
RESULTS = BENCH_DIR / "results"
MIB = 1 << 20


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def memcpy_gbps(nbytes: int, repeats: int = 5) -> float:
    """Single-thread memcpy into a warm destination: the limit any same-node transfer has."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / min(times) / 1e9


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def make_venv(name: str, requirements: list[list[str]]) -> Path:
    """Create ``benchmarks/.venvs/NAME`` and pip-install each requirement list in turn."""
    py = venv_python(name)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENVS / name)], check=True)
    for reqs in requirements:
        subprocess.run([str(py), "-m", "pip", "install", "-q", *reqs], check=True)
    return py


class Peer:
    """A peer-side script kept running between rounds: one JSON command in, one JSON result out."""

    def __init__(self, python: Path, script: Path, *args: str) -> None:
        env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(BENCH_DIR))
        self.proc = subprocess.Popen(
            [str(python), str(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def call(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"peer exited with code {self.proc.wait()}")

    def close(self) -> None:
        try:
            self.call(op="quit")
        except (RuntimeError, BrokenPipeError, OSError):
            pass
        self.proc.wait(timeout=60)


def serve(handlers: dict[str, Callable[..., dict[str, Any]]]) -> None:
    """Peer side of ``Peer``: read commands from stdin, answer each with a RESULT line."""
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "quit":
            print("RESULT {}", flush=True)
            return
        print("RESULT " + json.dumps(handlers[op](**command)), flush=True)


def ab_rounds(sides: dict[str, Callable[[], dict[str, float]]], rounds: int) -> dict[str, list[dict[str, float]]]:
    """Run every side once per round, in the same order each round (A B A B ...)."""
    out: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for r in range(rounds):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            out[name].append(fn())
            print(f"  round {r + 1}/{rounds} {name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    return out


def medians(per_round: list[dict[str, float]]) -> dict[str, float]:
    keys = per_round[0].keys() if per_round else []
    return {k: median([r[k] for r in per_round]) for k in keys}


def write_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return path


def environment() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def g1_model(threads: int, training: bool) -> Any:
    """G1's model (Qwen2, hidden 128, 4 layers, ~1.05M parameters, seed 0) after setting torch's
    thread count; torch and transformers are imported here, so peer scripts need neither."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=19, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0)
    return Qwen2ForCausalLM(config).train(training)
