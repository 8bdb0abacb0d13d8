from pathlib import Path

import pytest

from m2flow.config import ConfigError, compose, load_config, parse_override, save_config, to_yaml

from tests.config.example_schemas import ActorCfg, StageCfg, TrainCfg

BASE = """\
workflow: tiny
name: base
seed: 1
actor:
  model_path: /models/tiny
  optim:
    lr: 0.01
cluster:
  num_cpus: 4
"""


@pytest.fixture
def base_yaml(tmp_path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(BASE)
    return path


def load_error(schema, path=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(schema, path, overrides)
    return str(info.value)


def test_file_values_over_defaults(base_yaml):
    cfg = load_config(TrainCfg, base_yaml)
    assert (cfg.name, cfg.seed, cfg.actor.optim.lr, cfg.cluster.num_cpus) == ("base", 1, 0.01, 4)
    assert cfg.actor.optim.steps == 100  # default, not in the file
    assert cfg.actor.model_path == Path("/models/tiny")


def test_overrides_of_nested_keys_win_over_the_file(base_yaml):
    cfg = load_config(
        TrainCfg,
        base_yaml,
        ["actor.optim.lr=1e-4", "cluster.num_cpus=8", "seed=3", "actor.mode=hybrid", "actor.use_kl=true"],
    )
    assert cfg.actor.optim.lr == 1e-4
    assert cfg.cluster.num_cpus == 8 and cfg.seed == 3
    assert cfg.actor.mode == "hybrid" and cfg.actor.use_kl is True


def test_later_override_wins():
    cfg = load_config(ActorCfg, None, ["model_path=a", "model_path=b"])
    assert cfg.model_path == Path("b")


def test_overrides_are_typed_by_the_schema(base_yaml):
    cfg = load_config(
        TrainCfg,
        base_yaml,
        ["name=2024", "actor.tags=[a, '1.10']", "cluster.address=null", "actor.max_grad_norm=null"],
    )
    assert cfg.name == "2024"  # a text field keeps the text as typed
    assert cfg.cluster.address is None and cfg.actor.max_grad_norm is None
    assert cfg.actor.tags == ("a", "1.10")
    # Inside a list or mapping the YAML rules apply, so unquoted 1.10 is a number.
    assert load_error(TrainCfg, base_yaml, ["actor.tags=[a, 1.10]"]) == (
        "actor.tags[1]: expected str, got 1.1 (float); quote it in YAML"
    )
    # Quotes force text where null would be a value; a non-optional text field keeps "null".
    assert load_config(TrainCfg, base_yaml, ["cluster.address='null'"]).cluster.address == "null"
    assert load_config(TrainCfg, base_yaml, ["name=null"]).name == "null"


def test_override_lists_and_list_items(base_yaml):
    cfg = load_config(
        TrainCfg,
        base_yaml,
        ["actor.micro_batch_sizes=[4,8]", "stages=[{name: a}, {name: b}]", "stages.1.envs=3"],
    )
    assert cfg.actor.micro_batch_sizes == [4, 8]
    assert cfg.stages == [StageCfg("a", 1), StageCfg("b", 3)]


def test_dict_fields_replace_their_default_and_merge_with_the_file(base_yaml, tmp_path):
    # A dict value replaces the dataclass default entirely (so entries can be dropped) ...
    cfg = load_config(TrainCfg, base_yaml, ["actor.loss_weights.kl=0.1"])
    assert cfg.actor.loss_weights == {"kl": 0.1}
    # ... while an override merges into what the file wrote.
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  model_path: m\n  loss_weights: {pg: 2}\n")
    cfg = load_config(TrainCfg, path, ["actor.loss_weights.kl=0.1"])
    assert cfg.actor.loss_weights == {"pg": 2.0, "kl": 0.1}


def test_bool_override_rejects_yes(base_yaml):
    message = load_error(TrainCfg, base_yaml, ["actor.use_kl=yes"])
    assert message == "actor.use_kl: expected bool (true or false), got 'yes' (str)"


def test_int_override_is_parsed_and_checked(base_yaml):
    assert load_error(TrainCfg, base_yaml, ["seed=3.5"]) == "seed: expected int, got 3.5 (float)"
    assert load_error(TrainCfg, base_yaml, ["seed=three"]) == "seed: expected int, got 'three' (str)"


def test_unknown_override_key_is_named_with_a_suggestion(base_yaml):
    message = load_error(TrainCfg, base_yaml, ["actor.optim.lrr=0.1"])
    assert message == "actor.optim.lrr: unknown key; did you mean 'lr'? allowed keys: lr, betas, steps"


def test_unknown_key_in_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  model_path: m\n  optimm: {lr: 1}\n")
    assert load_error(TrainCfg, path).startswith("actor.optimm: unknown key; did you mean 'optim'?")


def test_literal_override_lists_allowed(base_yaml):
    message = load_error(TrainCfg, base_yaml, ["actor.mode=fast"])
    assert message == "actor.mode: 'fast' is not one of 'collocated', 'disaggregated', 'hybrid'"


def test_override_into_a_plain_value_is_refused(base_yaml):
    message = load_error(TrainCfg, base_yaml, ["actor.optim.lr.x=1"])
    assert "actor.optim.lr.x" in message and "no sub-keys" in message


@pytest.mark.parametrize("text", ["seed", "=3", "a..b=1", ""])
def test_malformed_override(text):
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override(text)


def test_interpolation_in_the_file_follows_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: run-${seed}\nseed: 7\nactor:\n  model_path: /models/${name}\n"
        "cluster:\n  num_cpus: ${seed}\n"
    )
    cfg = load_config(TrainCfg, path)
    assert (cfg.name, cfg.actor.model_path, cfg.cluster.num_cpus) == (
        "run-7", Path("/models/run-7"), 7
    )
    cfg = load_config(TrainCfg, path, ["seed=9"])
    assert (cfg.name, cfg.cluster.num_cpus) == ("run-9", 9)


def test_environment_interpolation(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_TEST_MODEL", "/env/model")
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  model_path: ${oc.env:M2FLOW_TEST_MODEL}\n")
    assert load_config(TrainCfg, path).actor.model_path == Path("/env/model")


def test_broken_interpolation_names_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: ${nowhere}\nactor: {model_path: m}\n")
    assert load_error(TrainCfg, path) == (
        "name: cannot resolve interpolation: Interpolation key 'nowhere' not found"
    )


def test_value_marked_required_in_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  model_path: ???\n")
    assert load_error(TrainCfg, path).startswith("actor.model_path: value is ???")
    assert load_config(TrainCfg, path, ["actor.model_path=/m"]).actor.model_path == Path("/m")


def test_missing_file_and_non_mapping_file(tmp_path):
    assert load_error(TrainCfg, tmp_path / "absent.yaml") == (
        f"config file not found: {tmp_path / 'absent.yaml'}"
    )
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert "top level must be a mapping" in load_error(TrainCfg, path)


def test_empty_file_means_all_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(TrainCfg, path, ["actor.model_path=m"]).seed == 0


def test_missing_required_field(base_yaml, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\n")
    assert load_error(TrainCfg, path) == "actor.model_path: missing required field (path)"


def test_validate_hooks_run_through_the_loader(base_yaml):
    assert load_error(TrainCfg, base_yaml, ["cluster.num_cpus=0"]) == (
        "cluster.num_cpus: must be >= 1, got 0"
    )
    assert load_error(TrainCfg, base_yaml, ["actor.mode=hybrid", "cluster.num_cpus=1"]) == (
        "actor.mode: 'hybrid' needs cluster.num_cpus >= 2, got 1"
    )


def test_workflow_key_is_dropped_for_schemas_without_it(base_yaml):
    assert "workflow" in compose(base_yaml)
    load_config(TrainCfg, base_yaml)  # no "unknown key: workflow"


def test_to_yaml_round_trip_is_equal(base_yaml, tmp_path):
    cfg = load_config(
        TrainCfg,
        base_yaml,
        [
            "name=\\${not_an_interpolation}",  # escaped: a literal ${
            "actor.tags=['yes', '010', '1e-3', 'a: b', '']",
            "stages=[{name: s, envs: 2}]",
            "actor.backend=fsdp",
            "cluster.address=null",
        ],
    )
    assert cfg.name == "${not_an_interpolation}"
    text = to_yaml(cfg, workflow="tiny")
    assert text.startswith("workflow: tiny\n")
    saved = save_config(cfg, tmp_path / "run" / "config.yaml", workflow="tiny")
    assert saved.read_text() == text
    assert load_config(TrainCfg, saved) == cfg
