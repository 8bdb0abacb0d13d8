"""Weight sync: stream a model's named tensors from one rank to many, in buckets of bounded size.

The sender packs tensors into buckets of about ``bucket_bytes`` and broadcasts each bucket (one
shared-memory copy for all same-node receivers); receivers copy each bucket into their model and
drop it, which frees the segment for the next bucket. The sender waits while more than
``max_inflight`` buckets are still held, so memory stays bounded whatever the model size.

A stream may open with the version of the weights (``send_weights(..., version=)``), so that a receiver
that takes a stream whenever one has arrived (``Communicator.pending``; a rollout between decoding steps)
knows which it loaded; ``recv_weights`` passes over it, ``recv_versioned_weights`` returns it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import torch

from m2flow.runtime.comm.communicator import Communicator
from m2flow.runtime.comm.errors import CommError
from m2flow.runtime.comm.transport import LinkKind

Named = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | torch.nn.Module


def _named(weights: Named) -> Iterable[tuple[str, torch.Tensor]]:
    if isinstance(weights, torch.nn.Module):
        return weights.state_dict(keep_vars=False).items()
    if isinstance(weights, Mapping):
        return weights.items()
    return weights


def send_weights(
    comm: Communicator,
    weights: Named,
    dst_group: str,
    dst_ranks: Sequence[int] | None = None,
    bucket_bytes: int = 64 << 20,
    max_inflight: int = 2,
    version: int | None = None,
) -> int:
    """Broadcast named tensors (a module's state dict, a dict, or pairs) in buckets; returns their count.
    ``version``: sent ahead of the buckets, for ``recv_versioned_weights``."""
    count, bucket, size = 0, {}, 0
    # A receiver in this process would get the live tensors themselves and copy them whenever it
    # gets to it: it gets a copy taken now instead, as a receiver elsewhere does.
    dst_ranks = list(dst_ranks) if dst_ranks is not None else None
    in_process = any(comm.transport_to(dst_group, r) == LinkKind.IN_PROCESS for r in (dst_ranks if dst_ranks is not None else [0]))

    def flush(kind: str = "weights") -> None:
        nonlocal count, bucket, size
        payload = {k: v.clone() for k, v in bucket.items()} if in_process else bucket
        comm.broadcast((kind, count, payload), dst_group, dst_ranks)
        count, bucket, size = count + 1, {}, 0
        comm.wait_shm_below(max_inflight * bucket_bytes)

    if version is not None:
        comm.broadcast(("weights-version", int(version), None), dst_group, dst_ranks)
    for name, tensor in _named(weights):
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            flush()
        bucket[name] = tensor.detach()
        size += nbytes
    if bucket:
        flush("weights-last")  # the last bucket also ends the stream: one message (and wake-up) fewer
    else:
        comm.broadcast(("weights-end", count, None), dst_group, dst_ranks)
    return count


def recv_weights(
    comm: Communicator,
    src_group: str,
    src_rank: int,
    into: torch.nn.Module | MutableMapping[str, torch.Tensor] | None = None,
    strict: bool = True,
) -> dict[str, torch.Tensor]:
    """Receive one ``send_weights`` stream; copies into ``into`` in place, or returns owned copies.

    With ``strict`` every tensor of ``into`` must arrive and every arriving name must exist there.
    Returns the received names mapped to the destination tensors.
    """
    return recv_versioned_weights(comm, src_group, src_rank, into, strict)[1]


def recv_versioned_weights(
    comm: Communicator,
    src_group: str,
    src_rank: int,
    into: torch.nn.Module | MutableMapping[str, torch.Tensor] | None = None,
    strict: bool = True,
) -> tuple[int | None, dict[str, torch.Tensor]]:
    """``recv_weights``, and the version the stream was sent with (None: sent without one)."""
    target: Any = into.state_dict() if isinstance(into, torch.nn.Module) else into
    out: dict[str, torch.Tensor] = {}
    expected, version = 0, None
    while True:
        kind, index, bucket = comm.recv(src_group, src_rank)
        if kind == "weights-version" and expected == 0 and version is None:
            version = index
            continue
        if kind == "weights-end":
            if index != expected:
                raise CommError(f"weight stream from {src_group}[{src_rank}] ended after {expected} of {index} buckets")
            break
        if kind not in ("weights", "weights-last") or index != expected:
            raise CommError(f"unexpected message in the weight stream from {src_group}[{src_rank}]: {kind} #{index}")
        expected += 1
        for name, tensor in bucket.items():
            if target is None:
                out[name] = tensor.clone()  # owned memory, so the sender's segment is freed
                continue
            dst = target.get(name)
            if dst is None:
                if strict:
                    raise KeyError(f"received weight {name!r} has no destination; known: {sorted(target)[:20]}")
                continue
            with torch.no_grad():
                dst.copy_(tensor)
            out[name] = dst
        del bucket
        if kind == "weights-last":
            break
    if strict and target is not None:
        missing = sorted(set(target) - set(out))
        if missing:
            raise KeyError(f"weights never arrived for {missing[:20]}")
    return version, out
