"""Where communicators publish how to reach them: Ray's internal KV, a directory, or process memory.

Records are JSON, never pickles: reading one runs no code, whoever wrote the store.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from m2flow.runtime.comm.errors import CommTimeout


@dataclass(frozen=True)
class PeerRecord:
    """How to reach one rank and how to tell whether it shares our process, node or GPU."""

    group: str
    rank: int
    process_uid: str
    pid: int
    hostname: str
    node_id: str
    unix_address: tuple
    tcp_address: tuple
    world_size: int | None = None
    cuda_uuids: tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        return f"{self.group}[{self.rank}] (pid {self.pid} on {self.hostname})"


class Rendezvous(Protocol):
    """A small shared key-value store."""

    def publish(self, key: str, value: bytes) -> None: ...

    def lookup(self, key: str) -> bytes | None: ...

    def remove(self, key: str) -> None: ...


class RayKVRendezvous:
    """Ray's internal KV (the GCS): reachable from every driver and actor of the cluster."""

    def __init__(self, namespace: str) -> None:
        self.namespace = f"m2flow:{namespace}"

    def publish(self, key: str, value: bytes) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(key, value, overwrite=True, namespace=self.namespace)

    def lookup(self, key: str) -> bytes | None:
        from ray.experimental import internal_kv

        return internal_kv._internal_kv_get(key, namespace=self.namespace)

    def remove(self, key: str) -> None:
        from ray.experimental import internal_kv

        try:
            internal_kv._internal_kv_del(key, namespace=self.namespace)
        except Exception:  # the cluster may already be gone at shutdown
            pass


class FileRendezvous:
    """Files in a directory (created 0700: only the run's user reads or writes it) for processes on one machine without Ray."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.dir / key.replace("/", "%2F")

    def publish(self, key: str, value: bytes) -> None:
        tmp = self._path(key).with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(value)
        tmp.replace(self._path(key))  # atomic: readers never see half a record

    def lookup(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class MemoryRendezvous:
    """A dict shared by the communicators of one process (per namespace)."""

    _store: dict[tuple[str, str], bytes] = {}
    _lock = threading.Lock()

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace

    def publish(self, key: str, value: bytes) -> None:
        with self._lock:
            self._store[(self.namespace, key)] = value

    def lookup(self, key: str) -> bytes | None:
        with self._lock:
            return self._store.get((self.namespace, key))

    def remove(self, key: str) -> None:
        with self._lock:
            self._store.pop((self.namespace, key), None)


def default_rendezvous(namespace: str) -> Rendezvous:
    """This process only while it hosts its workers (``runtime.inprocess``); else Ray's KV when Ray
    is up; else ``$M2FLOW_RENDEZVOUS_DIR``; else this process only."""
    from m2flow.runtime import inprocess

    if inprocess.hosting():
        return MemoryRendezvous(namespace)
    try:
        import ray

        if ray.is_initialized():
            return RayKVRendezvous(namespace)
    except ImportError:
        pass
    directory = os.environ.get("M2FLOW_RENDEZVOUS_DIR")
    if directory:
        return FileRendezvous(Path(directory) / namespace)
    return MemoryRendezvous(namespace)


def record_key(group: str, rank: int) -> str:
    return f"comm/{group}/{rank}"


R = TypeVar("R")


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def encode_record(record: Any) -> bytes:
    """A record dataclass (fields of str, int, None and nested tuples) as JSON bytes."""
    return json.dumps(asdict(record)).encode()


def decode_record(cls: type[R], raw: bytes) -> R:
    """The inverse of ``encode_record``: JSON lists come back as the tuples they were."""
    data = json.loads(raw)
    return cls(**{f.name: _tuples(data[f.name]) for f in fields(cls) if f.name in data})  # type: ignore[arg-type]


def publish_record(rdv: Rendezvous, record: PeerRecord) -> None:
    rdv.publish(record_key(record.group, record.rank), encode_record(record))


def lookup_record(rdv: Rendezvous, group: str, rank: int) -> PeerRecord | None:
    raw = rdv.lookup(record_key(group, rank))
    return None if raw is None else decode_record(PeerRecord, raw)


def wait_record(rdv: Rendezvous, group: str, rank: int, timeout: float) -> PeerRecord:
    """Poll until ``group[rank]`` has published its record (its communicator started)."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        record = lookup_record(rdv, group, rank)
        if record is not None:
            return record
        if time.monotonic() > deadline:
            raise CommTimeout(
                f"{group}[{rank}] did not start its communicator within {timeout:.0f}s "
                "(is the group launched, and the rank in range?)"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


HOSTNAME = socket.gethostname()
