from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import pytest

from m2flow.config import ConfigError, describe, option, type_name, undocumented
from m2flow.config.schema import MISSING, target_type

from tests.config.example_schemas import ActorCfg, Backend, ClusterCfg, OptimCfg, TrainCfg, Undocumented


def test_option_requires_a_doc():
    with pytest.raises(TypeError, match="doc"):
        option(1)
    with pytest.raises(TypeError, match="not both"):
        option(1, "x", default_factory=list)


def test_mutable_defaults_are_copied_per_instance():
    a, b = ActorCfg(model_path=Path("m")), ActorCfg(model_path=Path("m"))
    a.micro_batch_sizes.append(99)
    a.optim.lr = 5.0
    assert b.micro_batch_sizes == [1, 2]
    assert b.optim == OptimCfg()


def test_describe_lists_nested_fields_with_type_default_and_doc():
    infos = {info.key: info for info in describe(TrainCfg)}
    assert list(infos)[:3] == ["actor", "actor.model_path", "actor.mode"]
    assert infos["actor"].section and infos["actor"].doc == "the actor"
    assert infos["actor.model_path"].default is MISSING
    assert infos["actor.optim.lr"].default == 1e-3
    assert infos["actor.optim.lr"].doc == "learning rate"
    assert infos["actor.mode"].type == "'collocated' | 'disaggregated' | 'hybrid'"
    assert infos["cluster.address"].type == "str | None"
    assert infos["cluster.num_cpus"].default == 2
    assert infos["stages"].type == "list[StageCfg]"


def test_undocumented_finds_fields_without_doc():
    assert undocumented(TrainCfg) == []
    assert undocumented(Undocumented) == ["bare"]


@pytest.mark.parametrize(
    ("tp", "name"),
    [
        (int, "int"),
        (Optional[str], "str | None"),
        (Literal["a", "b"], "'a' | 'b'"),
        (list[float], "list[float]"),
        (dict[str, list[int]], "dict[str, list[int]]"),
        (tuple[float, float], "tuple[float, float]"),
        (tuple[str, ...], "tuple[str, ...]"),
        (Path, "path"),
        (Backend, "'torch' | 'fsdp'"),
        (ClusterCfg, "ClusterCfg"),
    ],
)
def test_type_name(tp, name):
    assert type_name(tp) == name


def test_target_type_walks_sections_lists_and_dicts():
    assert target_type(TrainCfg, "actor.optim.lr") is float
    assert target_type(TrainCfg, "cluster.address") == Optional[str]
    assert target_type(TrainCfg, "stages.0.name") is str
    assert target_type(TrainCfg, "actor.loss_weights.pg") is float
    assert target_type(TrainCfg, "actor.optim.betas.1") is float
    assert target_type(TrainCfg, "actor.nonexistent") is None


def test_target_type_refuses_sub_keys_of_a_value():
    with pytest.raises(ConfigError) as info:
        target_type(TrainCfg, "actor.optim.lr.x")
    assert str(info.value) == (
        "actor.optim.lr.x: 'actor.optim.lr' holds a value of type float; it has no sub-keys"
    )


def test_string_annotations_are_resolved():
    # example_schemas uses `from __future__ import annotations`; a local class without it:
    @dataclass
    class Local:
        n: int = option(1, "n")

    assert describe(Local)[0].type == "int"
