"""The agentic workflow on Ray: the same metrics as on the local executor, and an env worker killed with
SIGKILL mid-iteration restarted alone, its unfinished episodes played again, nothing lost or duplicated."""

from __future__ import annotations

import pytest

from m2flow.runtime.waiting import gather
from m2flow.driver.run import Run
from m2flow.autoplan.entry import train
from m2flow.workflows.agentic.workflow import WORKFLOW
from tests.ray_session import shared_cluster
from tests.workflows.agentic.envs import marker_pid
from tests.workflows.agentic.setup import comparable, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


@pytest.mark.slow
def test_ray_computes_what_the_local_executor_computes(tmp_path):
    local = train(WORKFLOW, tiny_config(tmp_path / "local", tmp_path / "model", steps=2))
    on_ray = train(WORKFLOW, tiny_config(tmp_path / "ray", tmp_path / "model", steps=2,
                               placement="env: 0-1, rollout: 0-1, actor: 0"), cluster=shared_cluster())
    assert on_ray.plan.executor == "ray" and [on_ray.plan[c].world_size for c in ("env", "rollout")] == [2, 2]
    # Two env workers and two rollout ranks instead of one each play the same episodes (each episode's turns
    # are seeded by its own id): the same data, the same updates, up to the order the actor summed groups in.
    assert _learning(on_ray.history) == pytest.approx(_learning(local.history), rel=1e-5)
    assert [h["env/steps"] for h in on_ray.history] == [h["env/steps"] for h in local.history]


def test_an_env_worker_killed_mid_iteration_is_restarted_alone_and_nothing_is_lost(tmp_path):
    marker = tmp_path / "killed"
    cfg = tiny_config(tmp_path, steps=3, placement="env: 0-1, rollout,actor: 0", **{
        "env.name": "test_dies_once",
        "env.kwargs": {"marker": str(marker), "from_seed": 2, "high": 8, "max_turns": 4}})  # iteration 1's seeds
    with Run(WORKFLOW, cfg, shared_cluster()) as run:
        flow = run.flow
        env_pids = flow.env_pids()
        others = {"rollout": flow.rollout.pids(), "actor": flow.actor.pids()}
        result = run.train()
        emitted = [t for part in gather([flow.rollout.emitted_ids()])[0] for t in part]
        taken = [(s, g) for part in gather([flow.actor.received_groups()])[0] for s, g, _, _ in part]
        after = flow.env_pids()
        assert {"rollout": flow.rollout.pids(), "actor": flow.actor.pids()} == others
    killed = marker_pid(str(marker))
    assert killed in env_pids and result.restarts == 0  # the flow went on: no restart from a checkpoint
    lost = env_pids.index(killed)
    assert after[lost] != killed and after[1 - lost] == env_pids[1 - lost]  # only the dead one is new
    assert [h["faults/env_restarts"] for h in result.history] == [0.0, 1.0, 1.0]
    assert result.history[1]["rollout/reruns"] > 0 and result.history[0]["rollout/reruns"] == 0
    assert sorted(emitted) == list(range(12))  # every trajectory once: none lost, none twice
    assert sorted(taken) == [(s, g) for s in range(3) for g in range(2)]
    # Each episode's turns are seeded by its own id: the re-run episodes played as they would have, so the run
    # ends where an uninterrupted one does (up to the order in which the actor summed the groups).
    calm = tiny_config(tmp_path / "calm", tmp_path / "model", steps=3, placement="env: 0-1, rollout,actor: 0", **{
        "env.name": "test_dies_once", "env.kwargs": {"marker": "", "high": 8, "max_turns": 4}})
    uninterrupted = train(WORKFLOW, calm, cluster=shared_cluster())
    assert _learning(result.history) == pytest.approx(_learning(uninterrupted.history), rel=1e-5)


def _learning(history: list[dict[str, float]]) -> dict[str, float]:
    """What the data and the updates were, by (iteration, metric): every metric but timings, env call counts
    and fault counters."""
    skip = ("env/", "faults/", "rollout/reruns", "rollout/rounds")
    return {f"{i}:{k}": v for i, h in enumerate(comparable(history)) for k, v in h.items() if not k.startswith(skip)}


@pytest.mark.slow
def test_a_hung_env_worker_is_restarted_alone_after_its_deadline(tmp_path):
    marker = tmp_path / "hung"
    cfg = tiny_config(tmp_path, steps=2, placement="env: 0-1, rollout,actor: 0", **{
        "env.name": "test_dies_once", "env.step_timeout_s": None, "env.worker_timeout_s": 5.0,
        "env.kwargs": {"marker": str(marker), "from_seed": 0, "hang_s": 600.0, "high": 8, "max_turns": 4}})
    with Run(WORKFLOW, cfg, shared_cluster()) as run:
        env_pids = run.flow.env_pids()
        result = run.train()
        emitted = [t for part in gather([run.flow.rollout.emitted_ids()])[0] for t in part]
        after = run.flow.env_pids()
    hung = env_pids.index(marker_pid(str(marker)))
    assert after[hung] != env_pids[hung] and after[1 - hung] == env_pids[1 - hung] and result.restarts == 0
    assert result.history[0]["faults/env_restarts"] == 1 and result.history[0]["rollout/reruns"] > 0
    assert sorted(emitted) == list(range(8))


def test_partial_rollouts_over_two_rollout_ranks_and_two_env_workers_train_each_task_instance_once(tmp_path):
    # Each rollout rank owes the slots of its groups; the env workers keep the carried episodes' environments
    # between iterations. Every task instance is trained once or still carried, on whichever rank it played.
    from tests.workflows.agentic.test_partial_episodes import PARTIAL

    cfg = tiny_config(tmp_path, tmp_path / "model", steps=3, placement="env: 0-1, rollout: 0-1, actor: 0",
                      **{**PARTIAL, "episodes.groups_per_step": 4})
    with Run(WORKFLOW, cfg, shared_cluster()) as run:
        assert run.plan.executor == "ray" and [run.plan[c].world_size for c in ("env", "rollout")] == [2, 2]
        history = run.train().history
        taken = [g for part in gather([run.flow.actor.received_groups()])[0] for g in part]
        handed = [g for part in gather([run.flow.rollout.handed_groups()])[0] for g in part]
        carried = [s for part in gather([run.flow.rollout.carried_seeds()])[0] for s in part]
    seeds = [seed for _, _, seed, _ in taken]
    assert len(seeds) == len(set(seeds)) == 12 and sorted(seeds + carried) == list(range(16))
    assert sorted(taken) == sorted((s, g, seed, True) for s, g, seed, _ in handed)
    assert sorted((s, g) for s, g, _, _ in taken) == [(s, g) for s in range(3) for g in range(4)]
    assert all(h["rollout/partial_carried_count"] == 4 for h in history)
    assert sum(h["rollout/partial_resumed_count"] for h in history) > 0
