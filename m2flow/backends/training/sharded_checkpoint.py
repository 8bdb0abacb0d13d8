"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): every rank writes its own shards.

A directory holds ``__<rank>_0.distcp`` (the tensors rank ``rank`` owns) and ``.metadata`` (where
every tensor's chunks lie, written by rank 0). Nothing is gathered on one rank, and a checkpoint
can be read back by any number of ranks, one process included (``load_full``).

Only tensors go into these files; the caller keeps plain values (optimizer hyper-parameters, lr
schedules) in files of its own. Reading is narrowed to what cannot run code. DCP's own reader
unpickles ``.metadata`` with plain ``pickle`` and loads any non-tensor item with
``torch.load(weights_only=False)``; here ``.metadata`` goes through an unpickler that admits only
DCP's metadata records, ``torch.Size``, dtypes, layouts and paths, and a non-tensor item is refused.
Tensor data is read by DCP itself with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

METADATA = ".metadata"

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "MetadataIndex",
        "BytesStorageMetadata", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath"},
    "collections": {"OrderedDict"},
}


class UnsafeShardsError(ValueError):
    """A sharded checkpoint's files hold something other than tensors and DCP's own records; not loaded."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata``: its record classes and torch's plain value types, nothing else."""

    def __init__(self, data: bytes, path: Path) -> None:
        super().__init__(io.BytesIO(data))
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeShardsError(f"{self.path}: refused to load: it names {module}.{name}, which is not part of a "
                                "sharded checkpoint's metadata")


def _reader(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            file = Path(self.path) / METADATA
            try:
                metadata = _MetadataUnpickler(file.read_bytes(), file).load()
            except UnsafeShardsError:
                raise
            except Exception as e:  # noqa: BLE001 - a torn or foreign file: say which, not how pickle failed
                raise UnsafeShardsError(f"{file}: not the metadata of a sharded checkpoint ({e})") from None
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def _planner(path: Path) -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            # DCP would torch.load these with weights_only=False; this format never writes any.
            raise UnsafeShardsError(f"{path}: refused to load {read_item.dest_index.fqn!r}: it is stored as a "
                                    "pickled object, not a tensor")

    return TensorsOnly()


def _tensors_only(tree: Any, where: str = "") -> None:
    if isinstance(tree, dict):
        for k, v in tree.items():
            _tensors_only(v, f"{where}.{k}" if where else str(k))
    elif not isinstance(tree, torch.Tensor):
        raise TypeError(f"a sharded checkpoint holds tensors only; {where} is a {type(tree).__name__}")


def save(path: str | Path, tensors: dict[str, Any]) -> None:
    """Write ``tensors`` (nested dicts of tensors and DTensors) to ``path``; every rank of the default
    process group calls with its own shards, and writes its own file."""
    import torch.distributed.checkpoint as dcp

    _tensors_only(tensors)
    Path(path).mkdir(parents=True, exist_ok=True)
    dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(path), sync_files=True))


def load(path: str | Path, tensors: dict[str, Any]) -> None:
    """Fill ``tensors`` (the same tree ``save`` got, shards of this rank's layout) in place from ``path``;
    a collective over the default process group when there is one."""
    import torch.distributed as dist

    _tensors_only(tensors)
    _reader(Path(path)).read_metadata()  # refuses a crafted file here, with its own message
    _load(tensors, Path(path), distributed=dist.is_available() and dist.is_initialized())


def _load(tree: dict[str, Any], path: Path, distributed: bool) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(tree, storage_reader=_reader(path), planner=_planner(path), no_dist=not distributed)
    except CheckpointException as e:  # DCP wraps each rank's error: raise ours as it was
        for inner, _trace in e.failures.values():
            if isinstance(inner, UnsafeShardsError):
                raise inner from None
        raise


def load_full(path: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor saved under ``prefix`` (e.g. ``"model"``), whole, in this one process: keys without the
    prefix. Reads the checkpoint of any number of ranks; no process group needed."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = _reader(Path(path)).read_metadata()
    head = f"{prefix}."
    template = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if not fqn.startswith(head):
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise UnsafeShardsError(f"{Path(path) / METADATA}: {fqn!r} is not a tensor")
        template[fqn[len(head):]] = torch.empty(md.size, dtype=md.properties.dtype)
    if not template:
        raise UnsafeShardsError(f"{Path(path) / METADATA}: no tensors under {prefix!r}")
    tree = {prefix: template}
    _load(tree, Path(path), distributed=False)
    return tree[prefix]
