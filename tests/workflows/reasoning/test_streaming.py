"""Continuous generation on a plan where the actor has devices of its own: the trace shows the actor
training on the first groups while the rest are still generating, and no group is lost or trained twice."""

from __future__ import annotations

from m2flow.runtime.trace import iter_spans, load_trace
from m2flow.driver.run import Run
from m2flow.workflows.reasoning.workflow import WORKFLOW
from tests.ray_session import shared_cluster
from tests.workflows.reasoning.setup import toy_config


def test_generation_overlaps_training_in_the_trace_and_every_group_is_trained_once(tmp_path):
    # 16 prompts x 8 responses, at most 16 rows decoding at once: eight waves of two prompts each.
    cfg = toy_config(tmp_path, "rollout,reward: 0, inference,actor: 1", trace=True, steps=3,
                     data={"prompts_per_step": 16}, algorithm={"old_logprobs": "actor"},
                     rollout={"backend": "lean", "max_running": 16})
    with Run(WORKFLOW, cfg, shared_cluster()) as run:
        assert run.plan.settings["generation"] == "continuous" and run.plan.settings["emit"] == "each group"
        result = run.train()
        received = run.flow.actor.received_groups().wait()
    taken = sorted((s, k) for rank in received for s, k, _, _ in rank)
    assert taken == [(s, k) for s in range(3) for k in range(16)]  # nothing lost, nothing twice
    spans = list(iter_spans(load_trace(result.run_dir)))

    def of(name, cat, step):
        return [s for s in spans if s["name"] == name and s["cat"] == cat and (s.get("args") or {}).get("step") == step]

    overlapped = 0
    for step in range(3):
        (gen,) = of("generate", "generate", step)  # the rollout's one device turn of the iteration
        gen_end = gen["ts"] + gen["dur"]
        sends = sorted(of("send", "generate", step), key=lambda s: s["ts"])
        assert len(sends) > 1 and sum(s["args"]["groups"] for s in sends) == 16
        assert sends[0]["ts"] + sends[0]["dur"] < gen_end  # the first groups left before generation ended
        trains = of("train", "train", step)
        assert sum(s["args"]["groups"] for s in trains) == 16
        overlapped += any(s["ts"] < gen_end for s in trains)
    # The actor trained on a micro-batch while generation still ran, in at least one iteration (on a
    # loaded machine the actor may start late; generation then takes longer too, so it is all but certain).
    assert overlapped >= 1


def test_a_collocated_continuous_run_sends_at_the_end_of_the_turn_and_repeats_itself(tmp_path):
    # placement local: the rollout fused into the actor, which trains only after generating.
    def run(root):
        cfg = toy_config(root, "local", steps=3, rollout={"backend": "lean", "max_running": 16})
        with Run(WORKFLOW, cfg) as r:
            assert r.plan.settings["generation"] == "continuous" and r.plan.settings["emit"] == "end of turn"
            return r.train().history

    first, again = run(tmp_path / "a"), run(tmp_path / "b")
    assert [h["rollout/emits_count"] for h in first] == [1.0, 1.0, 1.0]  # one send per iteration
    assert [h["rollout/responses_count"] for h in first] == [64.0] * 3
    keys = ("reward/mean", "rollout/tokens_count", "actor/pg_loss")
    assert [[h[k] for k in keys] for h in first] == [[h[k] for k in keys] for h in again]  # same seed, same run
