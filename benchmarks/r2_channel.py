"""R2: channel throughput between a producer worker and a consumer worker on one node.

Sides, run in turns in one session (A B A B ...), medians reported:
  m2flow        Channel (maxsize 16): get per item, get with prefetch, get_batch; 16 MiB tensors
  ray_queue     ray.util.queue.Queue between two actors (numpy arrays for the large items)
  rlinf         RLinf 0.3.0 Channel between two worker groups, in its own venv
  memcpy        single-thread memcpy of 16 MiB: the limit for the large items (R1 gives the
                point-to-point rate the channel builds on)
Items/s count small dict items; GB/s counts 16 MiB float32 tensors. Each side warms up first.

    python benchmarks/r2_channel.py --setup       # once: RLinf 0.3.0 into benchmarks/.venvs/rlinf
    python benchmarks/r2_channel.py [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import ray
import torch
from common import (
    MIB,
    Peer,
    ab_rounds,
    environment,
    make_venv,
    medians,
    memcpy_gbps,
    venv_python,
    write_result,
)
from r1_transfer import RLINF_REQUIREMENTS
from ray.util.queue import Empty, Queue

from m2flow.runtime import Cluster, ClusterConfig, WorkerGroup
from m2flow.runtime.channel import Channel
from m2flow.runtime.worker import Worker

BIG_MIB = 16
MAXSIZE = 16
PREFETCH = 64
BATCH = 64


class M2Producer(Worker):
    def produce(self, ch: Channel, n: int, nbytes: int) -> None:
        x = torch.ones(nbytes // 4) if nbytes else None
        for i in range(n):
            ch.put(x if x is not None else {"i": i}, weight=1)


class M2Consumer(Worker):
    def consume(self, ch: Channel, n: int, batch: int, prefetch: int) -> float:
        handle = ch.with_options(prefetch=prefetch)
        t0 = time.perf_counter()
        got = 0
        while got < n:
            if batch > 1:
                got += len(handle.get_batch(min(batch, n - got)))
            else:
                handle.get()
                got += 1
        return time.perf_counter() - t0


@ray.remote(num_cpus=0)
class QueueProducer:
    def produce(self, q: Queue, n: int, nbytes: int) -> None:
        x = np.ones(nbytes, dtype=np.uint8) if nbytes else None
        for i in range(n):
            q.put(x if x is not None else {"i": i})


@ray.remote(num_cpus=0)
class QueueConsumer:
    def consume(self, q: Queue, n: int, batch: int) -> float:
        t0 = time.perf_counter()
        got = 0
        while got < n:
            if batch > 1:
                ready = min(batch, n - got, q.qsize())
                try:
                    got += len(q.get_nowait_batch(ready)) if ready else 0
                except Empty:
                    pass
                if not ready:
                    q.get()  # nothing queued: block for one
                    got += 1
            else:
                q.get()
                got += 1
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true", help="install RLinf 0.3.0 into benchmarks/.venvs/rlinf and exit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer items (a smoke run)")
    ap.add_argument("--no-rlinf", action="store_true", help="skip the RLinf side")
    args = ap.parse_args()
    if args.setup:
        print(make_venv("rlinf", RLINF_REQUIREMENTS))
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    n_small = 1000 if args.quick else 5000
    n_big = 20 if args.quick else 60
    n_small_slow = 100 if args.quick else 300  # the actor-call queues manage a few hundred per second

    cluster = Cluster(ClusterConfig())
    prod = WorkerGroup(M2Producer, cluster, "r2_prod", num_ranks=1)
    cons = WorkerGroup(M2Consumer, cluster, "r2_cons", num_ranks=1)
    qprod, qcons = QueueProducer.remote(), QueueConsumer.remote()
    names = itertools.count()
    rlinf = None
    if not args.no_rlinf:
        py = venv_python("rlinf")
        if not py.exists():
            sys.exit("RLinf is not installed: run `python benchmarks/r2_channel.py --setup` first (or pass --no-rlinf)")
        rlinf = Peer(py, Path(__file__).parent / "peers" / "rlinf_peer.py")

    def m2flow() -> dict[str, float]:
        ch = Channel.create(f"r2-{next(names)}", maxsize=MAXSIZE)

        def run(n: int, nbytes: int, batch: int, prefetch: int) -> float:
            consuming = cons.consume(ch, n, batch, prefetch)
            prod.produce(ch, n, nbytes).wait()
            return consuming.wait()[0]

        run(50, BIG_MIB * MIB, 1, 1)  # warm-up: connections and shared segments
        out = {
            "small_items_per_s": n_small / run(n_small, 0, 1, 1),
            "small_prefetch_items_per_s": n_small / run(n_small, 0, 1, PREFETCH),
            "small_get_batch_items_per_s": n_small / run(n_small, 0, BATCH, 1),
            f"{BIG_MIB}MiB_GBps": n_big * BIG_MIB * MIB / run(n_big, BIG_MIB * MIB, 1, 1) / 1e9,
        }
        ch.destroy()
        return out

    def ray_queue() -> dict[str, float]:
        q = Queue(maxsize=MAXSIZE, actor_options={"num_cpus": 0})

        def run(n: int, nbytes: int, batch: int) -> float:
            consuming = qcons.consume.remote(q, n, batch)
            ray.get(qprod.produce.remote(q, n, nbytes))
            return ray.get(consuming)

        run(20, BIG_MIB * MIB, 1)
        out = {
            "small_items_per_s": n_small_slow / run(n_small_slow, 0, 1),
            "small_get_batch_items_per_s": n_small_slow / run(n_small_slow, 0, BATCH),
            f"{BIG_MIB}MiB_GBps": n_big * BIG_MIB * MIB / run(n_big, BIG_MIB * MIB, 1) / 1e9,
        }
        q.shutdown()
        return out

    sides = {
        "m2flow": m2flow,
        "ray_queue": ray_queue,
        "memcpy": lambda: {f"{BIG_MIB}MiB_GBps": memcpy_gbps(BIG_MIB * MIB)},
    }
    if rlinf is not None:
        sides["rlinf"] = lambda: rlinf.call(op="r2", n_small=n_small_slow, n_big=max(10, n_big // 3), big_mib=BIG_MIB, batch=BATCH)
    try:
        per_round = ab_rounds(sides, args.rounds)
    finally:
        if rlinf is not None:
            rlinf.close()
    med = {name: medians(rounds) for name, rounds in per_round.items()}
    m2 = med["m2flow"]
    ratios = {
        f"vs_{peer}": {k: m2[k] / med[peer][k] for k in m2 if k in med[peer]} for peer in ("rlinf", "ray_queue") if peer in med
    }
    ratios["of_memcpy"] = {f"{BIG_MIB}MiB_GBps": m2[f"{BIG_MIB}MiB_GBps"] / med["memcpy"][f"{BIG_MIB}MiB_GBps"]}
    result = {
        "benchmark": "R2 channel throughput, one producer and one consumer worker, one node",
        "workload": {
            "maxsize": MAXSIZE, "prefetch": PREFETCH, "batch": BATCH, "big_mib": BIG_MIB,
            "n_small_m2flow": n_small, "n_small_actor_queues": n_small_slow, "n_big": n_big, "rounds": args.rounds,
        },
        "environment": environment(),
        "medians": med,
        "ratios_gt1_means_m2flow_ahead": ratios,
        "per_round": per_round,
    }
    path = write_result("r2", result)
    rl = med.get("rlinf", {})
    nan = float("nan")
    print(
        f"R2: small items/s m2flow {m2['small_items_per_s']:.0f} (prefetch {m2['small_prefetch_items_per_s']:.0f}, "
        f"get_batch {m2['small_get_batch_items_per_s']:.0f}) vs RLinf {rl.get('small_items_per_s', nan):.0f} "
        f"(get_batch {rl.get('small_get_batch_items_per_s', nan):.0f}), ray Queue {med['ray_queue']['small_items_per_s']:.0f}; "
        f"{BIG_MIB} MiB tensors m2flow {m2[f'{BIG_MIB}MiB_GBps']:.2f} GB/s vs RLinf {rl.get(f'{BIG_MIB}MiB_GBps', nan):.2f}, "
        f"ray Queue {med['ray_queue'][f'{BIG_MIB}MiB_GBps']:.2f}, memcpy {med['memcpy'][f'{BIG_MIB}MiB_GBps']:.2f} -> {path}"
    )
    prod.shutdown()
    cons.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
