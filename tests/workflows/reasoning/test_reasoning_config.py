"""The reasoning config: documented, the examples load, impossible settings fail naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2flow.config import ConfigError, from_dict, undocumented
from m2flow.driver.registry import load_workflow_config
from m2flow.workflows.reasoning.evaluation import EvalConfig
from m2flow.workflows.reasoning.config import ReasoningConfig

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "reasoning").glob("*.yaml"))


def test_every_field_has_a_doc():
    assert undocumented(ReasoningConfig) == []
    assert undocumented(EvalConfig) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load_and_validate(path):
    spec, cfg = load_workflow_config(path)
    assert spec.name == "reasoning" and isinstance(cfg, ReasoningConfig)


def test_there_are_arithmetic_and_gsm8k_examples():
    names = {p.name for p in EXAMPLES}
    assert {"arithmetic_grpo.yaml", "gsm8k_grpo.yaml"} <= names


@pytest.mark.parametrize("data,key,message", [
    ({"placement": "actor: 0"}, "placement", "misses component"),
    ({"placement": "actor,rollout: 0-1, inference,reward: 1-2"}, "placement", "partly overlap"),
    ({"algorithm": {"adv_estimator": "nope"}}, "algorithm", "valid: dr_grpo, gae, grpo"),
    ({"algorithm": {"loss_agg": "mean"}}, "algorithm", "unknown loss aggregation"),
    ({"algorithm": {"old_logprobs": "actor"}, "actor": {"mini_batches": 2}}, "", "exact only with one optimizer"),
    ({"algorithm": {"kl_reward_coef": 0.1}}, "algorithm", "takes no KL in the reward"),
    ({"actor": {"strategy": "fsdp"}, "placement": "actor: 0-3, rollout,inference,reward: 4",
      "data": {"prompts_per_step": 2}}, "", "at least the number of actor ranks"),
    ({"data": {"kind": "gsm8k"}}, "data.path", "is required for kind 'gsm8k'"),
    ({"data": {"running_sums": {"max_steps": 0}}}, "data.running_sums.max_steps", "must be >= 1, got 0"),
    ({"data": {"running_sums": {"length_tail": -0.5}}}, "data.running_sums.length_tail", "must be >= 0"),
    ({"data": {"running_sums": {"test_size": 0}}}, "data.running_sums.test_size", "must be >= 1, got 0"),
    ({"data": {"running_sums": {"teacher_slip_rate": 2}}}, "data.running_sums.teacher_slip_rate", "in [0, 1]"),
    ({"rollout": {"sampling": {"n": 0}}}, "rollout.sampling.n", "must be >= 1, got 0"),
    ({"rollout": {"compile": True}}, "rollout.compile", "is an option of the 'lean' backend, not of 'hf'"),
    ({"actor": {"optim": {"lr": -1}}}, "actor.optim.lr", "must be > 0"),
    ({"rollout": {"batching": "continuous"}}, "rollout", "needs a backend with continuous batching (lean), not 'hf'"),
    ({"rollout": {"batching": "streaming"}}, "rollout.batching", "streaming"),
    ({"rollout": {"backend": "lean", "batching": "continuous", "prompts_per_chunk": 4}}, "rollout.prompts_per_chunk",
     "applies to batching 'chunked'"),
    ({"rollout": {"max_running": 3}}, "rollout.max_running", "must be >= sampling.n (4)"),
    ({"actor": {"micro_batch_tokens": 0}}, "actor.micro_batch_tokens", "must be >= 1 or None, got 0"),
    ({"inference": {"micro_batch_tokens": -5}}, "inference.micro_batch_tokens", "must be >= 1 or None, got -5"),
    ({"steps": 0}, "steps", "must be >= 1"),
])
def test_impossible_settings_fail_naming_the_key(data, key, message):
    with pytest.raises(ConfigError) as info:
        from_dict(ReasoningConfig, data)
    assert message in str(info.value)
    if key:
        assert str(info.value).startswith(key)


@pytest.mark.parametrize(("placement", "overrides", "fused"), [
    ("actor,rollout,inference,reward: 0", {}, True),
    ("actor,rollout,inference,reward: 0-1", {}, True),  # rank for rank on the same devices
    ("actor,rollout,inference,reward: 0", {"rollout": {"fuse_with_actor": False}}, False),
    ("actor,rollout,inference,reward: 0-1", {"actor": {"strategy": "fsdp"}}, False),  # sharded weights
    ("actor,rollout,inference,reward: 0", {"rollout": {"backend": "vllm"}}, False),  # an engine of its own
    ("actor,rollout,inference,reward: 0", {"rollout": {"dtype": "bfloat16"}}, False),
    ("rollout,reward,inference: 0, actor: 0-1", {}, False),  # different ranks
    ("rollout,reward,inference: 0, actor: 1", {}, False),
])
def test_the_rollout_fuses_into_the_actor_only_where_it_can_share_the_policy(placement, overrides, fused):
    from m2flow.runtime.placement import NodeLayout
    from m2flow.workflows.reasoning.workflow import WORKFLOW

    cfg = from_dict(ReasoningConfig, {"placement": placement, **overrides})
    plan = WORKFLOW.plan(cfg, NodeLayout((2,)))
    assert plan.fused("rollout") == fused
    assert plan["rollout"].launched != fused and plan.launched.count("rollout") == (not fused)


@pytest.mark.parametrize(("overrides", "settings"), [
    ({}, {"generation": "chunked", "prompts_per_chunk": 8, "actor_micro_batch": 16}),  # hf: no continuous batching
    ({"rollout": {"backend": "lean"}}, {"generation": "continuous", "max_running": 256, "prompts_per_chunk": 8}),
    ({"rollout": {"backend": "lean", "max_running": 8}}, {"generation": "continuous", "prompts_per_chunk": 2}),
    ({"rollout": {"backend": "lean", "prompts_per_chunk": 2}}, {"generation": "chunked", "prompts_per_chunk": 2}),
    ({"rollout": {"backend": "lean", "batching": "chunked"}}, {"generation": "chunked", "prompts_per_chunk": 8}),
    ({"actor": {"micro_batch_tokens": 512}}, {"actor_micro_batch_tokens": 512}),
])
def test_the_plan_records_how_finely_data_streams(overrides, settings):
    from m2flow.runtime.placement import NodeLayout
    from m2flow.workflows.reasoning.workflow import WORKFLOW

    cfg = from_dict(ReasoningConfig, {"data": {"prompts_per_step": 8}, **overrides})
    plan = WORKFLOW.plan(cfg, NodeLayout((2,)))
    assert {k: plan.settings.get(k) for k in settings} == settings
    assert ("actor_micro_batch" in plan.settings) != ("actor_micro_batch_tokens" in plan.settings)


@pytest.mark.parametrize(("placement", "overrides", "emit"), [
    ("actor,rollout,inference,reward: 0", {}, "end of turn"),  # the actor generates, then trains
    ("actor,rollout,inference,reward: 0", {"rollout": {"fuse_with_actor": False}}, "end of turn"),  # device turns
    ("rollout,reward,inference: 0, actor: 1", {"algorithm": {"old_logprobs": "actor"}}, "each group"),
    ("rollout,reward: 0, inference,actor: 1", {}, "each group"),
    ("rollout: 0, reward: 1, inference,actor: 1", {}, "each group"),  # reward needs no device turn
    ("actor,rollout,reward: 0, inference: 1", {}, "each group"),  # inference takes them during generation
])
def test_continuous_generation_sends_groups_one_by_one_where_the_next_stage_can_take_them(placement, overrides,
                                                                                         emit):
    from m2flow.runtime.placement import NodeLayout
    from m2flow.workflows.reasoning.workflow import WORKFLOW

    overrides = {**overrides, "rollout": {"backend": "lean", **overrides.get("rollout", {})}}
    cfg = from_dict(ReasoningConfig, {"placement": placement, **overrides})
    plan = WORKFLOW.plan(cfg, NodeLayout((2,)))
    assert plan.settings["generation"] == "continuous" and plan.settings["emit"] == emit
