"""The functional training forward, padded rows against packed groups, on G1's model and per-rank batch.

Times one forward and backward of the response log-probs of a GRPO batch (P prompts x n responses
of up to 16 tokens, about 37% of them at the limit, as G1 draws them) through the padded functional
forward (`functional_logits` over prompt + response rows) and through the packed one
(`packed_logits`: each prompt once, no padding inside a group), alternating, in one process.

    python benchmarks/packed_forward.py                    # 4 prompts x 4 (one G1 rank) and 8 x 4
    python benchmarks/packed_forward.py --prompts 8 --threads 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from common import g1_model

from m2flow.data.batch import left_pad, right_pad
from m2flow.models.causal_lm import logprobs_from_logits
from m2flow.models.functional_lm import functional_logits
from m2flow.models.packed_forward import packed_logits


def _batch(prompts: int, n: int, max_len: int, rng: random.Random) -> tuple[torch.Tensor, ...]:
    rows = [[rng.randint(1, 18) for _ in range(rng.choice([5, 6, 7]))] for _ in range(prompts)]
    rows = [p for p in rows for _ in range(n)]
    lens = [max_len if rng.random() < 0.375 else rng.randint(3, max_len - 1) for _ in rows]
    p_ids, p_mask = left_pad(rows, 0)
    r_ids = right_pad([[rng.randint(1, 18) for _ in range(k)] for k in lens], 0, width=max_len)
    r_mask = right_pad([[1] * k for k in lens], 0, width=max_len)
    return p_ids, p_mask, r_ids, r_mask


def _padded(model, p_ids, p_mask, r_ids, r_mask):
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1)
    return functional_logits(model, ids, mask, logits_to_keep=r_ids.shape[1] + 1)[:, :-1]


def _time(fn, model, batch, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        logp = logprobs_from_logits(fn(model, *batch), batch[2]) * batch[3]
        logp.sum().backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="4,8", help="comma-separated prompt counts per batch")
    ap.add_argument("--group", type=int, default=4, help="responses per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=30, help="timed passes per side and round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    model = g1_model(args.threads, training=True)
    for prompts in (int(p) for p in args.prompts.split(",")):
        batch = _batch(prompts, args.group, args.max_new_tokens, random.Random(0))
        _time(_padded, model, batch, 3), _time(packed_logits, model, batch, 3)  # warm-up
        padded, packed = [], []
        for _ in range(args.rounds):
            padded.append(_time(_padded, model, batch, args.reps))
            packed.append(_time(packed_logits, model, batch, args.reps))
        a, b = statistics.median(padded), statistics.median(packed)
        print(f"{prompts} prompts x {args.group}, {args.threads} thread(s): padded {a * 1e3:.1f} ms, "
              f"packed {b * 1e3:.1f} ms per forward+backward ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
