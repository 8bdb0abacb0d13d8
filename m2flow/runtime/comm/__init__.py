"""Point-to-point communication between workers, with the transport chosen per message.

``Communicator`` is what ``Worker.send/recv/broadcast`` delegate to; ``send_weights`` and
``recv_weights`` implement the bucketed weight-sync path on top of it.
"""

from m2flow.runtime.comm.communicator import PROCESS_UID, Communicator
from m2flow.runtime.comm.errors import (
    CommError,
    CommTimeout,
    PeerClosedError,
    PeerDiedError,
)
from m2flow.runtime.comm.rendezvous import (
    FileRendezvous,
    MemoryRendezvous,
    RayKVRendezvous,
    Rendezvous,
)
from m2flow.runtime.comm.transport import Transport
from m2flow.runtime.comm.work import CommWork

__all__ = [
    "PROCESS_UID", "CommError", "CommTimeout", "CommWork", "Communicator", "FileRendezvous",
    "MemoryRendezvous", "PeerClosedError", "PeerDiedError", "RayKVRendezvous", "Rendezvous", "Transport", "recv_weights", "send_weights",
]


def __getattr__(name: str):
    # The weight-sync path needs torch; it loads on first use, so that a process moving only bytes
    # through this package (a channel host) never imports torch.
    if name in ("recv_weights", "send_weights"):
        from m2flow.runtime.comm import weights

        return getattr(weights, name)
    raise AttributeError(f"module 'm2flow.runtime.comm' has no attribute {name!r}")
