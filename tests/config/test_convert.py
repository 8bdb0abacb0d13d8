from dataclasses import dataclass
from pathlib import Path

import pytest

from m2flow.config import ConfigError, from_dict, option, to_dict, validate_tree

from tests.config.example_schemas import ActorCfg, Backend, ClusterCfg, OptimCfg, StageCfg, TrainCfg

MINIMAL = {"actor": {"model_path": "/models/tiny"}}


def error_of(data, schema=TrainCfg) -> str:
    with pytest.raises(ConfigError) as info:
        from_dict(schema, data)
    return str(info.value)


def test_defaults_fill_everything_not_given():
    cfg = from_dict(TrainCfg, MINIMAL)
    assert cfg == TrainCfg(actor=ActorCfg(model_path=Path("/models/tiny")))
    assert cfg.cluster == ClusterCfg()


def test_every_field_kind_is_converted():
    cfg = from_dict(
        TrainCfg,
        {
            "actor": {
                "model_path": "/m",
                "mode": "hybrid",
                "backend": "fsdp",
                "optim": {"lr": 1, "betas": [0.5, 0.6], "steps": 1e3},
                "micro_batch_sizes": [4, 8],
                "loss_weights": {"pg": 1, "kl": 0.5},
                "use_kl": True,
                "max_grad_norm": 1.0,
                "tags": ["a", "b"],
            },
            "cluster": {"address": "auto", "num_cpus": 4},
            "stages": [{"name": "s0"}, {"name": "s1", "envs": 8}],
        },
    )
    assert cfg.actor.model_path == Path("/m")
    assert cfg.actor.backend is Backend.FSDP
    assert cfg.actor.optim == OptimCfg(lr=1.0, betas=(0.5, 0.6), steps=1000)
    assert isinstance(cfg.actor.optim.lr, float) and isinstance(cfg.actor.optim.steps, int)
    assert cfg.actor.loss_weights == {"pg": 1.0, "kl": 0.5}
    assert cfg.actor.tags == ("a", "b")
    assert cfg.stages == [StageCfg("s0", 1), StageCfg("s1", 8)]


def test_enum_accepts_member_name_too():
    assert from_dict(ActorCfg, {"model_path": "m", "backend": "FSDP"}).backend is Backend.FSDP


def test_unknown_key_names_it_lists_allowed_and_suggests():
    message = error_of({"actor": {"model_path": "m", "optim": {"lrr": 0.1}}})
    assert message == "actor.optim.lrr: unknown key; did you mean 'lr'? allowed keys: lr, betas, steps"


def test_unknown_key_without_close_match():
    message = error_of({**MINIMAL, "zzzz": 1})
    assert message.startswith("zzzz: unknown key; allowed keys: actor, name, seed, cluster, stages")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"seed": "3"}, "seed: expected int, got '3' (str)"),
        ({"seed": 2.5}, "seed: expected int, got 2.5 (float)"),
        ({"seed": True}, "seed: expected int, got True (bool)"),
        ({"name": 2024}, "name: expected str, got 2024 (int); quote it in YAML"),
        ({"cluster": {"num_cpus": None}}, "cluster.num_cpus: expected int, got null"),
        ({"cluster": 3}, "cluster: expected a mapping of ClusterCfg fields, got 3 (int)"),
        ({"stages": {"name": "x"}}, "stages: expected a list (list[StageCfg]), got {'name': 'x'} (dict)"),
    ],
)
def test_wrong_type_names_key_expected_type_and_value(data, expected):
    assert error_of({**MINIMAL, **data}) == expected


@pytest.mark.parametrize("value", ["yes", "true", 1, 0, None])
def test_bool_accepts_only_true_and_false(value):
    message = error_of({"model_path": "m", "use_kl": value}, ActorCfg)
    assert message.startswith("use_kl: expected bool")


def test_float_field_accepts_int_and_rejects_text():
    assert from_dict(OptimCfg, {"lr": 2}).lr == 2.0
    assert error_of({"lr": "1e-3"}, OptimCfg) == "lr: expected float, got '1e-3' (str)"


def test_literal_lists_allowed_values():
    message = error_of({"model_path": "m", "mode": "fast"}, ActorCfg)
    assert message == "mode: 'fast' is not one of 'collocated', 'disaggregated', 'hybrid'"


def test_enum_lists_allowed_values():
    message = error_of({"model_path": "m", "backend": "jax"}, ActorCfg)
    assert message == "backend: 'jax' is not one of 'torch', 'fsdp'"


def test_optional_accepts_null():
    cfg = from_dict(ActorCfg, {"model_path": "m", "max_grad_norm": None})
    assert cfg.max_grad_norm is None
    assert from_dict(ActorCfg, {"model_path": "m", "max_grad_norm": 2}).max_grad_norm == 2.0


def test_missing_required_field_is_named():
    assert error_of({}) == "actor.model_path: missing required field (path)"
    assert error_of({"actor": {}}) == "actor.model_path: missing required field (path)"
    assert error_of({**MINIMAL, "stages": [{"envs": 2}]}) == (
        "stages[0].name: missing required field (str)"
    )


def test_errors_inside_lists_and_dicts_carry_the_index_or_key():
    assert error_of({**MINIMAL, "stages": [{"name": "a"}, {"name": "b", "envs": "x"}]}) == (
        "stages[1].envs: expected int, got 'x' (str)"
    )
    data = {"model_path": "m", "loss_weights": {"pg": "high"}}
    assert error_of(data, ActorCfg) == "loss_weights.pg: expected float, got 'high' (str)"
    assert error_of({"betas": [0.9]}, OptimCfg) == (
        "betas: expected 2 items (tuple[float, float]), got 1"
    )


def test_nested_validate_is_prefixed_with_the_dotted_path():
    message = error_of({**MINIMAL, "cluster": {"num_cpus": 0}})
    assert message == "cluster.num_cpus: must be >= 1, got 0"


def test_validate_message_starting_with_a_field_name_without_colon():
    @dataclass
    class Section:
        num_cpus: int = option(1, "cpus")

        def validate(self) -> None:
            if self.num_cpus < 1:
                raise ValueError(f"num_cpus must be >= 1, got {self.num_cpus}")

    @dataclass
    class Top:
        cluster: Section = option(Section(), "cluster")

    assert error_of({"cluster": {"num_cpus": 0}}, Top) == "cluster.num_cpus: must be >= 1, got 0"


def test_validate_message_without_a_field_name_gets_the_section_path():
    message = error_of({**MINIMAL, "cluster": {"placement": "bad"}})
    assert message == "cluster: this placement cannot be parsed"


def test_post_init_check_is_prefixed_too():
    message = error_of({**MINIMAL, "stages": [{"name": "a", "envs": 65}]})
    assert message == "stages[0].envs: at most 64 per stage, got 65"


def test_top_level_validate_sees_the_whole_tree():
    data = {"actor": {"model_path": "m", "mode": "hybrid"}, "cluster": {"num_cpus": 1}}
    assert error_of(data) == "actor.mode: 'hybrid' needs cluster.num_cpus >= 2, got 1"


def test_validate_runs_innermost_first():
    order = []

    @dataclass
    class Inner:
        x: int = option(1, "x")

        def validate(self) -> None:
            order.append("inner")

    @dataclass
    class Outer:
        inner: Inner = option(Inner(), "inner")

        def validate(self) -> None:
            order.append("outer")

    from_dict(Outer, {})
    assert order == ["inner", "outer"]


def test_to_dict_gives_plain_data_that_converts_back_equal():
    cfg = from_dict(
        TrainCfg,
        {"actor": {"model_path": "/m", "backend": "fsdp", "tags": ["x"]}, "stages": [{"name": "a"}]},
    )
    data = to_dict(cfg)
    assert data["actor"]["model_path"] == "/m"
    assert data["actor"]["backend"] == "fsdp"
    assert data["actor"]["optim"]["betas"] == [0.9, 0.999]
    assert data["stages"] == [{"name": "a", "envs": 1}]
    assert from_dict(TrainCfg, data) == cfg


def test_validate_tree_checks_configs_built_in_code():
    cfg = TrainCfg(actor=ActorCfg(model_path=Path("m")), cluster=ClusterCfg(num_cpus=0))
    with pytest.raises(ConfigError, match=r"^cluster.num_cpus: must be >= 1, got 0$"):
        validate_tree(cfg)


def test_from_dict_needs_a_dataclass():
    with pytest.raises(TypeError):
        from_dict(dict, {})
