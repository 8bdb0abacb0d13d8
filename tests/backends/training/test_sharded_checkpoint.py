"""Sharded checkpoint files load without running code: crafted metadata and pickled items are refused."""

from __future__ import annotations

import pickle

import pytest
import torch

from m2flow.backends.training import sharded_checkpoint
from m2flow.backends.training.sharded_checkpoint import METADATA, UnsafeShardsError


def _saved(path):
    tensors = {"model": {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}}
    sharded_checkpoint.save(path, tensors)
    return tensors


def test_a_checkpoint_reads_back_whole_in_one_process(tmp_path):
    tensors = _saved(tmp_path)
    whole = sharded_checkpoint.load_full(tmp_path, "model")
    assert whole.keys() == tensors["model"].keys()
    assert all(torch.equal(whole[k], v) and whole[k].dtype == v.dtype for k, v in tensors["model"].items())
    into = {"model": {"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}}
    sharded_checkpoint.load(tmp_path, into)
    assert torch.equal(into["model"]["a"], tensors["model"]["a"])


class _Payload:
    def __reduce__(self):
        return (exec, ("open(__import__('os').environ['M2FLOW_TEST_MARK'], 'w').close()",))


def test_crafted_metadata_is_refused_naming_the_file_before_it_runs(tmp_path, monkeypatch):
    _saved(tmp_path)
    mark = tmp_path / "ran"
    monkeypatch.setenv("M2FLOW_TEST_MARK", str(mark))
    (tmp_path / METADATA).write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(UnsafeShardsError, match=rf"{METADATA}: refused to load: it names builtins.exec"):
        sharded_checkpoint.load_full(tmp_path, "model")
    with pytest.raises(UnsafeShardsError, match="refused to load"):
        sharded_checkpoint.load(tmp_path, {"model": {"a": torch.zeros(2, 3), "b": torch.zeros(4)}})
    assert not mark.exists()


def test_a_tensor_the_metadata_calls_a_pickled_object_is_refused(tmp_path):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    _saved(tmp_path)
    # Metadata that says "model.a" is a pickled object (DCP would torch.load it with weights_only=False).
    metadata = sharded_checkpoint._reader(tmp_path).read_metadata()
    metadata.state_dict_metadata["model.a"] = BytesStorageMetadata()
    chunk = next(k for k in metadata.storage_data if k.fqn == "model.a")
    metadata.storage_data[MetadataIndex("model.a")] = metadata.storage_data[chunk]
    metadata.storage_meta = None
    (tmp_path / METADATA).write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeShardsError, match="refused to load 'model.a': it is stored as a pickled object"):
        sharded_checkpoint.load(tmp_path, {"model": {"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}})


def test_only_tensors_are_saved(tmp_path):
    with pytest.raises(TypeError, match="model.lr is a float"):
        sharded_checkpoint.save(tmp_path, {"model": {"lr": 0.1}})
