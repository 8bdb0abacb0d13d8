"""Streaming generation: the reasoning runner's step time with chunked vs continuous generation (lean backend).

The two sides alternate on one local Ray cluster (chunked, continuous, chunked, ...); each run trains
7 iterations of a tiny Qwen2 model (4 layers x 128, random start) on arithmetic prompts with the
'7'-fraction toy reward, the first 2 iterations left out; figures are medians of `time/step` in ms.

    python benchmarks/streaming_generation.py PLACEMENT PROMPTS N MAX_NEW_TOKENS MAX_RUNNING REPEATS
    python benchmarks/streaming_generation.py "rollout,reward: 0, inference,actor: 1" 16 8 8 256 3
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from m2flow.config import from_dict
from m2flow.driver.run import Run
from m2flow.workflows.reasoning.workflow import WORKFLOW
from m2flow.workflows.reasoning.config import ReasoningConfig
from tests.ray_session import shared_cluster  # a local Ray cluster, started as the tests start it


def config(run_dir: Path, placement: str, batching: str, max_running: int, prompts: int, n: int, tokens: int,
           steps: int) -> ReasoningConfig:
    return from_dict(ReasoningConfig, {
        "placement": placement,
        "model": {"path": str(run_dir.parent / "model"), "create_tiny": True,
                  "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_layers": 4, "num_heads": 4,
                           "num_kv_heads": 2, "seed": 1}},
        "data": {"prompts_per_step": prompts, "arithmetic": {"train_size": 512, "test_size": 16}},
        "rollout": {"backend": "lean", "batching": batching, "max_running": max_running,
                    "sampling": {"n": n, "max_new_tokens": tokens}},
        "reward": {"fn": "tests.workflows.toy_reward:target_fraction"},
        "algorithm": {"old_logprobs": "actor"},
        "actor": {"optim": {"lr": 0.001}, "micro_batch_size": 4 * n, "forward": "packed"},
        "steps": steps, "run_dir": str(run_dir), "metrics": {"sinks": ["jsonl"]},
    })


def main() -> None:
    placement, (prompts, n, tokens, max_running, repeats) = sys.argv[1], map(int, sys.argv[2:7])
    cluster = shared_cluster()
    workdir = Path(tempfile.mkdtemp(prefix="m2flow-streaming-"))
    steps: dict[str, list[float]] = {"chunked": [], "continuous": []}
    try:
        for rep in range(repeats):
            for mode, times in steps.items():
                cfg = config(workdir / f"{mode}{rep}", placement, mode, max_running, prompts, n, tokens, 7)
                with Run(WORKFLOW, cfg, cluster) as run:
                    times.extend(h["time/step"] for h in run.train().history[2:])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"placement": placement, "shape": [prompts, n, tokens], "max_running": max_running,
                      **{m: round(1000 * statistics.median(v), 1) for m, v in steps.items()}}))


if __name__ == "__main__":
    main()
