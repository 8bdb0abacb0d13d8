"""RLinf 0.3.0 side of R1 and R2, run by ``benchmarks/.venvs/rlinf/bin/python``.

Starts one RLinf cluster, launches a sender/producer and a receiver/consumer worker group of one
rank each, then serves measurement rounds on request (see ``common.serve``).
"""

from __future__ import annotations

import sys
import time

import ray
import torch
from common import MIB, median, serve
from rlinf.scheduler import Channel, Cluster, Worker

SEND, RECV = "r1_send", "r1_recv"


class Sender(Worker):
    def __init__(self) -> None:
        super().__init__()
        torch.set_num_threads(1)

    def latency(self, iters: int) -> float:
        times = []
        for i in range(iters):
            t0 = time.perf_counter()
            self.send({"i": i}, dst_group_name=RECV, dst_rank=0)
            self.recv(src_group_name=RECV, src_rank=0)
            times.append(time.perf_counter() - t0)
        return median(times) / 2  # one way

    def transfer(self, nbytes: int, iters: int, inplace: bool) -> float:
        x = torch.ones(nbytes // 4)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            if inplace:
                self.send_tensor(x, dst_group_name=RECV, dst_rank=0)
            else:
                self.send(x, dst_group_name=RECV, dst_rank=0)
            self.recv(src_group_name=RECV, src_rank=0)
            times.append(time.perf_counter() - t0)
        return median(times)


class Receiver(Worker):
    def __init__(self) -> None:
        super().__init__()
        torch.set_num_threads(1)

    def echo(self, iters: int) -> None:
        for _ in range(iters):
            self.recv(src_group_name=SEND, src_rank=0)
            self.send(1, dst_group_name=SEND, dst_rank=0)

    def sink(self, nbytes: int, iters: int, inplace: bool) -> None:
        buf = torch.empty(nbytes // 4) if inplace else None
        for _ in range(iters):
            if inplace:
                self.recv_tensor(buf, src_group_name=SEND, src_rank=0)
            else:
                y = self.recv(src_group_name=SEND, src_rank=0)
                del y
            self.send(1, dst_group_name=SEND, dst_rank=0)


class Producer(Worker):
    def __init__(self) -> None:
        super().__init__()
        torch.set_num_threads(1)

    def produce(self, channel: Channel, n: int, nbytes: int) -> None:
        x = torch.ones(nbytes // 4) if nbytes else None
        for i in range(n):
            channel.put(x if x is not None else {"i": i}, weight=1)


class Consumer(Worker):
    def __init__(self) -> None:
        super().__init__()
        torch.set_num_threads(1)

    def consume(self, channel: Channel, n: int, batch: int) -> float:
        t0 = time.perf_counter()
        got = 0
        while got < n:
            if batch > 1:
                got += len(channel.get_batch(target_weight=min(batch, n - got)))
            else:
                channel.get()
                got += 1
        return time.perf_counter() - t0


def _private_ray() -> None:
    """Make RLinf start its own loopback Ray instead of attaching to any Ray found on the machine.

    RLinf first tries ``ray.init(address="auto")``, which would join whatever other Ray session
    runs here; refusing that makes it fall back to starting a local one, as on a fresh machine.
    """
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # keep the node on 127.0.0.1
    real_init = ray.init

    def init(*args, **kwargs):
        if kwargs.get("address") == "auto":
            raise ConnectionError("the benchmark runs RLinf on a private Ray")
        kwargs.setdefault("_node_ip_address", "127.0.0.1")
        kwargs.setdefault("include_dashboard", False)
        return real_init(*args, **kwargs)

    ray.init = init


def main() -> None:
    _private_ray()
    cluster = Cluster(num_nodes=1)
    sender = Sender.create_group().launch(cluster, name=SEND)
    receiver = Receiver.create_group().launch(cluster, name=RECV)
    producer = Producer.create_group().launch(cluster, name="r2_prod")
    consumer = Consumer.create_group().launch(cluster, name="r2_cons")
    channels = iter(range(1_000_000))

    def r1(iters_small: int, sizes_mib: list[int], iters_big: list[int]) -> dict[str, float]:
        out: dict[str, float] = {}
        echo = receiver.echo(iters_small + 10)
        out["small_one_way_us"] = 1e6 * sender.latency(iters_small + 10).wait()[0]
        echo.wait()
        for mib, iters in zip(sizes_mib, iters_big, strict=True):
            for inplace in (False, True):
                sink = receiver.sink(mib * MIB, iters, inplace)
                t = sender.transfer(mib * MIB, iters, inplace).wait()[0]
                sink.wait()
                out[f"{mib}MiB_{'inplace_' if inplace else ''}GBps"] = mib * MIB / t / 1e9
        return out

    def r2(n_small: int, n_big: int, big_mib: int, batch: int) -> dict[str, float]:
        channel = Channel.create(name=f"r2_{next(channels)}")
        warm = consumer.consume(channel, 10, 1)  # connections and groups are set up here
        producer.produce(channel, 10, big_mib * MIB).wait()
        warm.wait()
        out: dict[str, float] = {}
        for label, n, nbytes, b in (
            ("small_items_per_s", n_small, 0, 1),
            ("small_get_batch_items_per_s", n_small, 0, batch),
            (f"{big_mib}MiB_GBps", n_big, big_mib * MIB, 1),
        ):
            consuming = consumer.consume(channel, n, b)
            producer.produce(channel, n, nbytes).wait()
            dt = consuming.wait()[0]
            out[label] = n * nbytes / dt / 1e9 if nbytes else n / dt
        return out

    serve({"r1": r1, "r2": r2})


if __name__ == "__main__":
    sys.exit(main())
