"""The lean backend's decoding step, eager against `torch.compile`d (`rollout.compile`), on G1's model.

Times one `FunctionalLM.decode` of B rows (prompts of 12 tokens, room for 16 new ones, 8 tokens in) through
the eager step and through the compiled one, alternating, in one process. The compile itself (once,
before the timing) is reported apart.

    python benchmarks/functional_decode_step.py                     # 16 rows (one G1 rank) and 32 (the batch)
    python benchmarks/functional_decode_step.py --rows 32 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import g1_model

from m2flow.models.functional_lm import DecodeState, FunctionalLM


def _state(decoder: FunctionalLM, rows: int, prompt_len: int, new_tokens: int, filled: int) -> DecodeState:
    ids = torch.randint(1, 19, (rows, prompt_len))
    _, state = decoder.prefill(ids, torch.ones_like(ids), new_tokens)
    tokens = torch.randint(1, 19, (rows,))
    for _ in range(filled):
        decoder.decode(tokens, state)
    return state


def _time(decoder: FunctionalLM, state: DecodeState, reps: int) -> float:
    """Median seconds of one decoding step, each from the same cache position (the slot is rewritten)."""
    tokens = torch.randint(1, 19, (state.keys.shape[1],))
    length, position = state.length, state.next_position
    times = []
    for _ in range(reps):
        state.length, state.next_position = length, position
        t0 = time.perf_counter()
        decoder.decode(tokens, state)
        times.append(time.perf_counter() - t0)
    state.key_bias[..., length:] = float("-inf")  # the slot is empty again for the next side
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="16,32", help="comma-separated batch sizes")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=200, help="timed steps per side and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = g1_model(args.threads, training=False)
    eager, compiled = FunctionalLM.from_hf(model), FunctionalLM.from_hf(model, compile=True)
    with torch.no_grad():
        t0 = time.perf_counter()
        _state(compiled, 2, 12, 16, 1)
        print(f"compile: {time.perf_counter() - t0:.1f} s (once per process)")
        for rows in (int(r) for r in args.rows.split(",")):
            states = _state(eager, rows, 12, 16, 8), _state(compiled, rows, 12, 16, 8)
            a, b = [], []
            for _ in range(args.rounds):
                a.append(_time(eager, states[0], args.reps))
                b.append(_time(compiled, states[1], args.reps))
            ea, cb = statistics.median(a), statistics.median(b)
            print(f"{rows} rows, {args.threads} thread(s): eager {ea * 1e3:.2f} ms, compiled {cb * 1e3:.2f} ms "
                  f"per decoding step ({ea / cb:.2f}x)")
        if compiled.compiled.failure:
            print(f"the compiled step fell back to eager: {compiled.compiled.failure}")


if __name__ == "__main__":
    main()
