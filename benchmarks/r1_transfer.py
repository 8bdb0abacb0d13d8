"""R1: point-to-point transfer between two workers on one node.

Sides, run in turns in one session (A B A B ...), medians reported:
  m2flow      Worker.send / Worker.recv (shared memory on one node)
  m2flow_tcp  the same, with the transport forced to the cross-node path (a TCP stream)
  gloo        torch.distributed gloo send/recv into a preallocated tensor, between two actors
  ray         plain Ray: the sender passes a numpy array to the receiver actor (object store)
  rlinf       RLinf 0.3.0 Worker.send/recv (and send_tensor/recv_tensor in place), in its own venv
  memcpy      single-thread memcpy into a warm buffer: the limit
Each transfer is timed from the send to the receiver's small acknowledgement, so GB/s figures
include one small-message latency; small-object latency is half a ping-pong.

    python benchmarks/r1_transfer.py --setup      # once: RLinf 0.3.0 into benchmarks/.venvs/rlinf
    python benchmarks/r1_transfer.py [--rounds 3] [--quick]
    python benchmarks/r1_transfer.py --cross-node # the cross-node path: a two-node Ray cluster here;
                                                  # m2flow's socket stream vs gloo vs Ray's object transfer
"""

from __future__ import annotations

import argparse
import os
import socket
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
    median,
    medians,
    memcpy_gbps,
    venv_python,
    write_result,
)

from m2flow.runtime import Cluster, ClusterConfig, WorkerGroup
from m2flow.runtime.comm import Communicator
from m2flow.runtime.worker import Worker

RLINF_REQUIREMENTS = [["torch==2.13.0", "ray==2.60.0", "numpy"], ["rlinf==0.3.0"]]


class M2Sender(Worker):
    def __init__(self) -> None:
        _ = self.comm  # listen from the start

    def transport_to(self, group: str, rank: int) -> str:
        return self.comm.transport_to(group, rank)

    def use_transport(self, kind: str) -> None:
        self._m2flow_comm.close()
        self._m2flow_comm = Communicator(self.group_name, self.rank, self.node_ip, self.cluster_namespace, transport=kind)

    def latency(self, iters: int) -> float:
        times = []
        for i in range(iters):
            t0 = time.perf_counter()
            self.send({"i": i}, "r1_recv", 0)
            self.recv("r1_recv", 0)
            times.append(time.perf_counter() - t0)
        return median(times[10:]) / 2

    def transfer(self, nbytes: int, iters: int) -> float:
        x = torch.ones(nbytes // 4)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.send(x, "r1_recv", 0)
            self.recv("r1_recv", 0)
            times.append(time.perf_counter() - t0)
        return median(times[2:])


class M2Receiver(M2Sender):
    def echo(self, iters: int) -> None:
        for _ in range(iters):
            self.recv("r1_send", 0)
            self.send(1, "r1_send", 0)

    def sink(self, nbytes: int, iters: int) -> None:
        for _ in range(iters):
            y = self.recv("r1_send", 0)
            del y  # releases the shared segment for the sender's next message
            self.send(1, "r1_send", 0)


@ray.remote(num_cpus=0)
class RayReceiver:
    def take(self, x: object) -> int:
        return 1


@ray.remote(num_cpus=0)
class RaySender:
    def __init__(self, receiver: ray.actor.ActorHandle) -> None:
        self.receiver = receiver

    def latency(self, iters: int) -> float:
        times = []
        for i in range(iters):
            t0 = time.perf_counter()
            ray.get(self.receiver.take.remote({"i": i}))
            times.append(time.perf_counter() - t0)
        return median(times[10:]) / 2

    def transfer(self, nbytes: int, iters: int) -> float:
        x = np.ones(nbytes, dtype=np.uint8)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            ray.get(self.receiver.take.remote(x))
            times.append(time.perf_counter() - t0)
        return median(times[2:])


@ray.remote(num_cpus=0)
class GlooPeer:
    def __init__(self, rank: int, port: int) -> None:
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.rank = rank
        self.pg = dist.ProcessGroupGloo(dist.TCPStore("127.0.0.1", port, 2, rank == 0), rank, 2)

    def ready(self) -> int:
        return self.rank

    def run(self, nbytes: int, iters: int) -> float:
        x = torch.ones(nbytes // 4)
        ack = torch.zeros(1)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            if self.rank == 0:
                self.pg.send([x], 1, 0).wait()
                self.pg.recv([ack], 1, 1).wait()
            else:
                self.pg.recv([x], 0, 0).wait()  # into a preallocated tensor: gloo needs one
                self.pg.send([ack], 0, 1).wait()
            times.append(time.perf_counter() - t0)
        return median(times[2:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cross_node(rounds: int, sizes: list[int], iters: list[int], small: int) -> None:
    """Sender on one Ray node, receiver on another (both on this machine, talking over loopback)."""
    from ray.cluster_utils import Cluster as RayTestCluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    raycluster = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 1})
    raycluster.add_node(num_cpus=1)
    raycluster.wait_for_nodes()
    cluster = Cluster(ClusterConfig(address=raycluster.address, cpu_devices_per_node=1))
    send = WorkerGroup(M2Sender, cluster, "r1_send", placement="0")
    recv = WorkerGroup(M2Receiver, cluster, "r1_recv", placement="1")
    on = [NodeAffinitySchedulingStrategy(n.node_id, soft=False) for n in cluster.nodes]
    ray_recv = RayReceiver.options(scheduling_strategy=on[1]).remote()
    ray_send = RaySender.options(scheduling_strategy=on[0]).remote(ray_recv)
    port = _free_port()
    gloo = [GlooPeer.options(scheduling_strategy=on[r]).remote(r, port) for r in (0, 1)]
    ray.get([g.ready.remote() for g in gloo])

    def m2flow() -> dict[str, float]:
        out = {}
        echo = recv.echo(small + 10)
        out["small_one_way_us"] = 1e6 * send.latency(small + 10).wait()[0]
        echo.wait()
        for mib, n in zip(sizes, iters):
            sink = recv.sink(mib * MIB, n + 2)
            out[f"{mib}MiB_GBps"] = mib * MIB / send.transfer(mib * MIB, n + 2).wait()[0] / 1e9
            sink.wait()
        return out

    def plain_ray() -> dict[str, float]:
        out = {"small_one_way_us": 1e6 * ray.get(ray_send.latency.remote(small + 10))}
        for mib, n in zip(sizes, iters):
            out[f"{mib}MiB_GBps"] = mib * MIB / ray.get(ray_send.transfer.remote(mib * MIB, n + 2)) / 1e9
        return out

    def gloo_side() -> dict[str, float]:
        return {
            f"{mib}MiB_GBps": mib * MIB / ray.get([g.run.remote(mib * MIB, n + 2) for g in gloo])[0] / 1e9
            for mib, n in zip(sizes, iters)
        }

    transport = send.execute("transport_to", "r1_recv", 0).wait()[0]
    per_round = ab_rounds({"m2flow_socket": m2flow, "ray_object_transfer": plain_ray, "gloo": gloo_side}, rounds)
    med = {name: medians(r) for name, r in per_round.items()}
    result = {
        "benchmark": "R1 cross-node transport choice: two Ray nodes on one machine (loopback TCP)",
        "workload": {"sizes_mib": sizes, "iters": iters, "small_iters": small, "rounds": rounds},
        "m2flow_transport": transport,
        "environment": environment(),
        "medians": med,
        "per_round": per_round,
    }
    path = write_result("r1_cross_node", result)
    print(
        f"R1 cross-node ({transport}): 128MiB socket {med['m2flow_socket']['128MiB_GBps']:.2f} GB/s, "
        f"gloo {med['gloo']['128MiB_GBps']:.2f}, Ray object transfer {med['ray_object_transfer']['128MiB_GBps']:.2f}; "
        f"small one-way socket {med['m2flow_socket']['small_one_way_us']:.0f} us vs Ray "
        f"{med['ray_object_transfer']['small_one_way_us']:.0f} us -> {path}"
    )
    send.shutdown()
    recv.shutdown()
    ray.shutdown()
    raycluster.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", action="store_true", help="install RLinf 0.3.0 into benchmarks/.venvs/rlinf and exit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    ap.add_argument("--no-rlinf", action="store_true", help="skip the RLinf side")
    ap.add_argument("--cross-node", action="store_true", help="measure the transports between two Ray nodes")
    args = ap.parse_args()
    if args.setup:
        print(make_venv("rlinf", RLINF_REQUIREMENTS))
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    torch.set_num_threads(1)
    sizes = [1, 16, 128]
    iters = [6, 4, 3] if args.quick else [30, 15, 8]
    small = 60 if args.quick else 500
    if args.cross_node:
        cross_node(args.rounds, sizes, iters, small)
        return

    cluster = Cluster(ClusterConfig())
    send = WorkerGroup(M2Sender, cluster, "r1_send", num_ranks=1)
    recv = WorkerGroup(M2Receiver, cluster, "r1_recv", num_ranks=1)
    ray_recv = RayReceiver.remote()
    ray_send = RaySender.remote(ray_recv)
    port = _free_port()
    gloo = [GlooPeer.remote(r, port) for r in (0, 1)]
    ray.get([g.ready.remote() for g in gloo])
    rlinf = None
    if not args.no_rlinf:
        py = venv_python("rlinf")
        if not py.exists():
            sys.exit("RLinf is not installed: run `python benchmarks/r1_transfer.py --setup` first (or pass --no-rlinf)")
        rlinf = Peer(py, Path(__file__).parent / "peers" / "rlinf_peer.py")

    def m2flow(kind: str) -> dict[str, float]:
        send.use_transport(kind).wait()
        recv.use_transport(kind).wait()
        out = {}
        echo = recv.echo(small + 10)
        out["small_one_way_us"] = 1e6 * send.latency(small + 10).wait()[0]
        echo.wait()
        for mib, n in zip(sizes, iters):
            sink = recv.sink(mib * MIB, n + 2)
            out[f"{mib}MiB_GBps"] = mib * MIB / send.transfer(mib * MIB, n + 2).wait()[0] / 1e9
            sink.wait()
        return out

    def plain_ray() -> dict[str, float]:
        out = {"small_one_way_us": 1e6 * ray.get(ray_send.latency.remote(small + 10))}
        for mib, n in zip(sizes, iters):
            out[f"{mib}MiB_GBps"] = mib * MIB / ray.get(ray_send.transfer.remote(mib * MIB, n + 2)) / 1e9
        return out

    def gloo_side() -> dict[str, float]:
        out = {}
        for mib, n in zip(sizes, iters):
            t = ray.get([g.run.remote(mib * MIB, n + 2) for g in gloo])[0]
            out[f"{mib}MiB_GBps"] = mib * MIB / t / 1e9
        return out

    sides = {
        "m2flow": lambda: m2flow("auto"),
        "ray": plain_ray,
        "m2flow_tcp": lambda: m2flow("tcp"),
        "gloo": gloo_side,
        "memcpy": lambda: {f"{mib}MiB_GBps": memcpy_gbps(mib * MIB) for mib in sizes},
    }
    if rlinf is not None:
        sides["rlinf"] = lambda: rlinf.call(op="r1", iters_small=small, sizes_mib=sizes, iters_big=iters)
    try:
        per_round = ab_rounds(sides, args.rounds)
    finally:
        if rlinf is not None:
            rlinf.close()
    med = {name: medians(rounds) for name, rounds in per_round.items()}
    m2 = med["m2flow"]
    ratios = {}
    for peer in ("rlinf", "ray"):
        if peer in med:
            ratios[f"vs_{peer}"] = {
                k: (med[peer][k] / m2[k] if k.endswith("_us") else m2[k] / med[peer][k])
                for k in m2
                if k in med[peer]
            }
    ratios["of_memcpy"] = {k: m2[k] / med["memcpy"][k] for k in m2 if k in med["memcpy"]}
    result = {
        "benchmark": "R1 point-to-point transfer, one node",
        "workload": {"sizes_mib": sizes, "iters": iters, "small_iters": small, "rounds": args.rounds},
        "environment": environment(),
        "medians": med,
        "ratios_gt1_means_m2flow_ahead": ratios,
        "per_round": per_round,
    }
    path = write_result("r1", result)
    rl = med.get("rlinf", {})
    print(
        f"R1: 128MiB m2flow {m2['128MiB_GBps']:.2f} GB/s vs RLinf {rl.get('128MiB_GBps', float('nan')):.2f} "
        f"(in place {rl.get('128MiB_inplace_GBps', float('nan')):.2f}), Ray {med['ray']['128MiB_GBps']:.2f}, "
        f"memcpy {med['memcpy']['128MiB_GBps']:.2f}; small one-way m2flow {m2['small_one_way_us']:.0f} us vs "
        f"RLinf {rl.get('small_one_way_us', float('nan')):.0f} us, Ray {med['ray']['small_one_way_us']:.0f} us; "
        f"cross-node path: socket {med['m2flow_tcp']['128MiB_GBps']:.2f} GB/s vs gloo {med['gloo']['128MiB_GBps']:.2f} "
        f"-> {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}"
    )
    send.shutdown()
    recv.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
