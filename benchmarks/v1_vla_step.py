"""The small VLA's cost on the CPU: acting (no gradients) and a training step (forward, backward, Adam).

    python benchmarks/v1_vla_step.py --threads 2 --batches 32 256

Writes ``benchmarks/results/v1_vla_step.json``: parameters, and per batch size the median
milliseconds of ``act`` and of one token-loss training step over ``--repeats`` timed calls (after
two warm-up calls), with the machine's load average, which these absolute figures depend on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import environment, median, write_result  # noqa: E402
from m2flow.models.vla import VLAConfig, VLAPolicy  # noqa: E402
from tests.models.test_vla import packed_obs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = VLAConfig()
    policy = VLAPolicy(config, 4)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    result = {"command": " ".join(["python", *sys.argv]), "environment": environment(), "threads": args.threads,
              "params": sum(p.numel() for p in policy.parameters()), "batches": {}}
    for batch in args.batches:
        obs = packed_obs(config, batch)
        tokens = torch.randint(0, config.num_bins, (batch, 4))
        act, train = [], []
        for i in range(args.repeats + 2):
            t0 = time.perf_counter()
            policy.act(obs)
            t1 = time.perf_counter()
            out = policy.token_outputs(obs, tokens)
            loss = -out.logprobs.mean() + out.values.square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            t2 = time.perf_counter()
            if i >= 2:
                act.append((t1 - t0) * 1e3)
                train.append((t2 - t1) * 1e3)
        result["batches"][str(batch)] = {"act_ms": median(act), "train_step_ms": median(train)}
        print(f"batch {batch}: act {median(act):.1f} ms, train step {median(train):.1f} ms ({args.threads} threads)")
    write_result("v1_vla_step", result)


if __name__ == "__main__":
    main()
