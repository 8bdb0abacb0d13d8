"""``PartialEpisodes``: the groups a rollout rank holds across iterations, the quota of one iteration, the
staleness restart and the checkpointed task instances, on a ``TurnEngine`` whose episodes are set by hand."""

from __future__ import annotations

import pytest

from m2flow.workers.agentic.partial_episodes import PartialEpisodes
from m2flow.workers.agentic.turns import EpisodeConfig, EpisodeSpec, TurnEngine


def _specs(instance: int, size: int = 2) -> list[EpisodeSpec]:
    """The ``size`` episodes of task instance ``instance`` (ids instance*10 + i, seed 100 + instance)."""
    return [EpisodeSpec(instance * 10 + i, instance, 100 + instance, 0) for i in range(size)]


def _play(engine: TurnEngine, tid: int, versions: list[int], done: bool) -> None:
    """Episode ``tid`` started, with one model token per version, ended or not."""
    ep = engine.episodes[tid]
    ep.started = True
    for v in versions:
        ep.add([7], [-1.0], v)
    ep.add([8], None, versions[-1] if versions else 0)  # an observation token: its version is never checked
    ep.done = done


def test_groups_fill_the_quota_in_the_order_they_finish_and_the_rest_are_carried():
    engine, p = TurnEngine(EpisodeConfig(), None, []), PartialEpisodes(max_staleness=1)
    opening = p.begin(0, engine, [s for i in range(4) for s in _specs(i)], quota=range(2))
    assert opening.reset == [0, 1, 10, 11, 20, 21, 30, 31] and opening.running == []
    for i in (2, 0, 3):
        p.complete(i)
    assert p.hand_out() == [(2, 0, [20, 21]), (0, 1, [0, 1])] and p.met()
    assert p.hand_out() == []  # the quota is full: instance 3 waits, whole
    counts = p.close()
    assert (counts.carried, counts.resumed, counts.restarted) == (2, 0, 0) and sorted(p.groups) == [1, 3]
    for t in (10, 11, 30, 31):
        _play(engine, t, [0], done=t in (30, 31))
    opening = p.begin(1, engine, _specs(4), quota=range(2))
    assert opening.reset == [40, 41] and opening.running == [10, 11]  # instance 3 finished: nothing to play
    assert p.hand_out() == [(3, 0, [30, 31])]  # finished past the last quota: handed out first
    p.complete(1)
    assert p.hand_out() == [(1, 1, [10, 11])]
    counts = p.close()
    assert (counts.carried, counts.resumed, counts.restarted) == (1, 2, 0) and list(p.groups) == [4]


def test_a_held_group_with_a_token_too_old_starts_over_every_episode_from_its_reset():
    engine, p = TurnEngine(EpisodeConfig(), None, []), PartialEpisodes(max_staleness=1)
    p.begin(0, engine, _specs(0) + _specs(1) + _specs(2), quota=range(1))
    _play(engine, 0, [0, 1], done=True)
    _play(engine, 1, [1], done=False)  # instance 0: a token of version 0
    _play(engine, 10, [1], done=True)
    _play(engine, 11, [1, 1], done=True)  # instance 1: finished, only version 1
    p.complete(2)
    p.hand_out()
    p.close()
    p.complete(1)  # finished past iteration 0's quota
    opening = p.begin(2, engine, _specs(3), quota=range(2))  # at iteration 2 a version-0 token is too old (2 - 1 > 0)
    assert p.counts.restarted == 1 and opening.reset == [0, 1, 30, 31] and opening.running == []
    assert engine.trajectory(0).response_ids == [] and not engine.episodes[1].started
    assert p.hand_out() == [(1, 0, [10, 11])]  # version 1 is within the bound: kept, handed out first
    assert p.counts.resumed == 1


def test_a_quota_larger_than_what_is_held_is_refused():
    engine, p = TurnEngine(EpisodeConfig(), None, []), PartialEpisodes(max_staleness=1)
    with pytest.raises(ValueError, match="2 groups owed from 1 held"):
        p.begin(0, engine, _specs(0), quota=range(2))


def test_a_checkpoint_keeps_the_task_instances_and_a_restore_plays_them_from_their_resets():
    engine, p = TurnEngine(EpisodeConfig(), None, []), PartialEpisodes(max_staleness=1)
    p.begin(0, engine, _specs(0) + _specs(1), quota=range(1))
    _play(engine, 0, [0], done=True)
    _play(engine, 1, [0], done=True)
    _play(engine, 10, [0], done=False)
    p.complete(0)
    p.hand_out()
    p.close()
    state = p.state(engine)
    assert state == [[10, 1, 101, 0], [11, 1, 101, 0]]
    fresh_engine, fresh = TurnEngine(EpisodeConfig(), None, []), PartialEpisodes(max_staleness=1)
    fresh.restore(fresh_engine, state)
    opening = fresh.begin(1, fresh_engine, _specs(2), quota=range(1))
    assert opening.reset == [10, 11, 20, 21] and fresh.counts.restarted == 1  # played again, counted


def test_a_group_that_could_not_be_trained_later_takes_a_slot_first_and_the_quota_waits_for_it():
    engine, p = TurnEngine(EpisodeConfig(), None, []), PartialEpisodes(max_staleness=1)
    p.begin(0, engine, [s for i in range(4) for s in _specs(i)], quota=range(2))
    for t in (0, 1, 10, 11):
        _play(engine, t, [0], done=False)  # instances 0 and 1 played under version 0, still running
    for i in (2, 3):
        p.complete(i)
    p.hand_out()
    p.close()
    # At iteration 1 a version-0 token is as old as may be trained: instances 0 and 1 are due, owed the slots.
    p.begin(1, engine, _specs(4) + _specs(5), quota=range(2))
    assert p.due == {0, 1}
    p.complete(4)
    assert p.hand_out() == [] and not p.met()  # both slots kept for the due groups still running
    for t in (0, 1):
        engine.episodes[t].done = True
    p.complete(0)
    assert p.hand_out() == [(0, 0, [0, 1])]  # one slot left, one due group running: instance 4 still waits
    p.complete(5)
    assert p.hand_out() == []
    p.complete(1)
    assert p.hand_out() == [(1, 1, [10, 11])] and p.met()
    counts = p.close()
    assert counts.restarted == 0 and sorted(p.groups) == [4, 5] and p.finished == [4, 5]
