"""The reasoning workflow with partial rollouts: every prompt put is trained once or still carried, never
twice; a checkpoint holds what is carried and a resumed run trains the groups of the uninterrupted one,
token for token (and, on another number of rollout ranks, every prompt still once); responses carried
across an iteration train with their tokens' own versions; impossible settings fail naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from m2flow.config import ConfigError, from_dict
from m2flow.driver.checkpoints import CHECKPOINTS
from m2flow.workers.actor import ActorWorker
from m2flow.workers.partial import PARTIAL_FILE
from m2flow.workers.state_file import load_state
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.reasoning.workflow import WORKFLOW
from tests.workflows.reasoning.setup import improved, toy_config, train_partial

pytestmark = pytest.mark.timeout(600)


def _config(root: Path, placement: str = "local", **overrides) -> ReasoningConfig:
    """The tiny GRPO run on the lean backend, partial rollouts on, bound 1, the rollout's log-probs."""
    algorithm = {"max_staleness": 1, "old_logprobs": "rollout", **overrides.pop("algorithm", {})}
    return toy_config(root, placement, algorithm=algorithm,
                      rollout={"backend": "lean", "partial": True, "fuse_with_actor": False,
                               "sampling": {"n": 8, "max_new_tokens": 12}},
                      **overrides)


def _recording_trained_tokens(monkeypatch) -> list[tuple]:
    """Every group the actor takes from now on, in-process: (iteration, slot, dataset index, per response its
    token ids, the versions and log-probs they were sampled with)."""
    seen: list[tuple] = []
    accept = ActorWorker._accept

    def recording(self, step, groups):
        for g in groups:
            b, rows = g.batch, []
            for i in range(len(b)):
                mask = b.response_mask[i].bool()
                rows.append((b.response_ids[i][mask].tolist(), b.token_versions[i][mask].tolist(),
                             b.rollout_logprobs[i][mask].tolist()))
            seen.append((g.step, g.slot, g.index, rows))
        return accept(self, step, groups)

    monkeypatch.setattr(ActorWorker, "_accept", recording)
    return seen


def _carried_in(checkpoint: Path) -> list[list[int]]:
    """Per rollout rank, the dataset indices of the prompts a checkpoint holds as carried."""
    return [[c["task"]["index"] for c in rank] for rank in load_state(checkpoint / PARTIAL_FILE)["ranks"]]


@pytest.mark.parametrize("data,message", [
    ({"rollout": {"backend": "lean", "partial": True}, "algorithm": {"max_staleness": 1}},
     "needs algorithm.max_staleness >= 1 and algorithm.old_logprobs 'rollout'"),
    ({"rollout": {"backend": "lean", "partial": True}, "algorithm": {"old_logprobs": "rollout"}},
     "needs algorithm.max_staleness >= 1"),
    ({"rollout": {"backend": "hf", "partial": True}}, "partial rollouts need continuous batching"),
])
def test_impossible_partial_settings_fail_naming_the_key(data, message):
    with pytest.raises(ConfigError) as info:
        from_dict(ReasoningConfig, data)
    assert message in str(info.value) and "partial" in str(info.value)


def test_the_plan_says_that_partial_rollouts_run_one_iteration_less_ahead(tmp_path):
    from m2flow.runtime.placement import NodeLayout

    layout = NodeLayout((2,))
    one = WORKFLOW.plan(_config(tmp_path), layout)
    assert any("generates 0 iteration(s) ahead, not 1" in n for n in one.notes)
    assert not any("generates while the actor trains" in n for n in one.notes)
    two = WORKFLOW.plan(_config(tmp_path, algorithm={"max_staleness": 2, "old_logprobs": "rollout"}), layout)
    assert any("generates 1 iteration(s) ahead, not 2" in n for n in two.notes)
    assert any("max_staleness 1: iteration k+1 generates while the actor trains on k" in n for n in two.notes)


def test_the_planner_prices_partial_rollouts_one_iteration_less_ahead(tmp_path):
    # The plan's run_ahead is what the flow runs and what the simulator prices: partial rollouts at
    # staleness s cost what s - 1 iterations ahead cost without them.
    from m2flow.planner.cost import ComponentCost, CostModel, Link
    from m2flow.planner.setup import setup_from_plan
    from m2flow.planner.simulate import Simulator
    from m2flow.runtime.placement import NodeLayout
    from m2flow.workflows.reasoning.graph import GRAPH
    from m2flow.workflows.reasoning.plan import WORKLOAD

    model = CostModel({"rollout": ComponentCost(a=0.5, c=0.05), "reward": ComponentCost(a=0.01),
                       "actor": ComponentCost(a=0.5, c=0.04)}, link=Link(latency=0.0))
    holders = [c.name for c in GRAPH.components if c.holds_model]

    def priced(staleness: int, partial: bool) -> tuple[int, float]:
        cfg = toy_config(tmp_path, "rollout,reward: 0, inference,actor: 1",
                         algorithm={"max_staleness": staleness, "old_logprobs": "rollout"},
                         rollout={"backend": "lean", "partial": partial, "fuse_with_actor": False})
        plan = WORKFLOW.plan(cfg, NodeLayout((2,)))
        simulated = Simulator(GRAPH, WORKLOAD, model).simulate(setup_from_plan(plan, holders))
        return plan.settings["run_ahead"], simulated.iteration_time

    assert priced(1, True) == priced(0, False) and priced(1, True)[0] == 0
    assert priced(2, True) == priced(1, False) and priced(2, True)[0] == 1
    assert priced(2, True)[1] < priced(1, True)[1]  # one iteration ahead: generation beside training


@pytest.mark.learning
def test_partial_rollouts_train_every_prompt_once_learn_and_checkpoints_hold_the_carried_ones(tmp_path):
    history, groups, put, carried = train_partial(_config(tmp_path, steps=6, checkpoint_every=3))
    assert len(history) == 6
    trained = [index for _, _, index, ok in groups if ok]
    assert len(groups) == 6 * 8 and len(trained) == len(groups)  # 8 groups an iteration, none too old
    # 64 training items, 8 an iteration plus one extra batch at the start only (a checkpoint takes none):
    # every index put is trained once or still carried, never both, never twice.
    assert len(put) == 56 and len(set(put)) == 56
    assert len(trained) == len(set(trained)) and not set(trained) & set(carried)
    assert sorted(trained + carried) == sorted(put) and len(carried) == 8
    checkpoints = tmp_path / "run" / CHECKPOINTS
    assert [len(r) for r in _carried_in(checkpoints / "step_000003")] == [8]
    assert sorted(_carried_in(checkpoints / "step_000006")[0]) == sorted(carried)  # the end's, exactly
    # Responses carried over: their groups train, their tokens of the older weights are weighted.
    assert sum(h["rollout/partial_resumed_count"] for h in history) > 0
    assert all(h["rollout/partial_carried_count"] == 8 for h in history)
    assert all(h["async/staleness_max"] <= 1 for h in history) and any(h["async/staleness_max"] == 1 for h in history)
    assert all(h["async/dropped_samples"] == 0 for h in history)
    assert improved(history), [h["reward/mean"] for h in history]


def test_a_resumed_run_trains_the_groups_of_the_uninterrupted_one_token_for_token(tmp_path, monkeypatch):
    trained = _recording_trained_tokens(monkeypatch)
    history, _, put, _ = train_partial(_config(tmp_path, steps=4, checkpoint_every=2))
    whole = list(trained)
    trained.clear()
    checkpoint = tmp_path / "run" / CHECKPOINTS / "step_000002"
    resumed, _, resumed_put, carried = train_partial(
        _config(tmp_path, steps=4, checkpoint_every=2, run_dir=str(tmp_path / "resumed"), resume=str(checkpoint)))
    assert len(resumed) == 2
    after = sorted(g for g in whole if g[0] >= 2)
    assert len(after) == 16 and sorted(trained) == after  # same groups, tokens, versions and log-probs
    assert any(len({v for _, versions, _ in g[3] for v in versions}) > 1 for g in after)  # some carried across
    # The data goes on where it stopped: 16 + 8 prompts put before the checkpoint, none again, no extra batch.
    assert resumed_put == put[24:]
    assert sorted(carried) == sorted(_carried_in(tmp_path / "run" / CHECKPOINTS / "step_000004")[0])
    for key in ("reward/mean", "rollout/tokens_count", "actor/pg_loss", "actor/grad_norm"):
        assert [h[key] for h in resumed] == pytest.approx([h[key] for h in history[2:]], rel=1e-5), key


# 4 s once the shared cluster's worker hosts are up (as earlier Ray tests of a suite leave them); alone,
# their start-up adds 35-95 s on a busy 2-core machine. The resume on one rank, in-process, adds a few seconds.
def test_two_rollout_ranks_on_ray_checkpoint_their_carried_prompts_and_resume_on_one(cluster, tmp_path):
    # Each rank owes the iteration's slots routed to it (slot % 2) and carries its own prompts: the
    # over-provisioned batch splits between the ranks, so each carries 4 and owes 4 an iteration.
    cfg = _config(tmp_path, "rollout,reward: 0-1, inference,actor: 2", steps=4, checkpoint_every=2)
    history, groups, put, carried = train_partial(cfg, cluster)
    assert len(history) == 4
    assert sorted((s, k) for s, k, _, _ in groups) == [(s, k) for s in range(4) for k in range(8)]
    trained = [index for _, _, index, ok in groups if ok]
    assert len(trained) == len(groups)  # none too old
    # 4 iterations of 8, plus one extra batch at the start.
    assert len(put) == 40 and len(set(put)) == 40
    assert len(trained) == len(set(trained)) and sorted(trained + carried) == sorted(put)
    checkpoint = tmp_path / "run" / CHECKPOINTS / "step_000002"
    assert [len(r) for r in _carried_in(checkpoint)] == [4, 4]
    assert all(h["rollout/partial_carried_count"] == 8 for h in history)  # 4 a rank, added up
    assert sum(h["rollout/partial_resumed_count"] for h in history) > 0
    assert all(h["async/staleness_max"] <= 1 and h["async/dropped_samples"] == 0 for h in history)
    # Resumed on one rollout rank: the two ranks' carried prompts are dealt to it; with the prompts trained
    # before the checkpoint, every prompt put is trained once or carried, none lost, none twice.
    resumed, resumed_groups, resumed_put, resumed_carried = train_partial(
        _config(tmp_path, steps=4, checkpoint_every=2, run_dir=str(tmp_path / "resumed"), resume=str(checkpoint)))
    assert len(resumed) == 2 and set(resumed_put) == set(put[24:])
    before = [index for s, _, index, _ in groups if s < 2]
    again = [index for _, _, index, ok in resumed_groups if ok]
    assert len(again) == 16 and all(s >= 2 for s, _, _, _ in resumed_groups)
    everything = before + again + resumed_carried
    assert len(everything) == len(set(everything)) and sorted(everything) == sorted(put[:24] + resumed_put)
    assert sum(h["rollout/partial_resumed_count"] for h in resumed) > 0  # rows begun on the two ranks went on
