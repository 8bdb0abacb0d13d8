"""Point-to-point communication between workers, with the transport chosen per message.

``Communicator`` is what ``Worker.send/recv/broadcast`` delegate to; ``send_weights`` and
``recv_weights`` implement the bucketed weight-sync path on top of it.
"""

from m2flow.lazy import lazy_names
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
    "MemoryRendezvous", "PeerClosedError", "PeerDiedError", "RayKVRendezvous", "Rendezvous", "Transport",
    "recv_versioned_weights", "recv_weights", "send_weights",
]

# The weight-sync path needs torch; it loads on first use, so that a process moving only bytes
# through this package (a channel host) never imports torch.
__getattr__, __dir__ = lazy_names(__name__, {
    "recv_weights": "weights", "recv_versioned_weights": "weights", "send_weights": "weights"})
