"""The env workers as the turn loop's environment side under partial rollouts: resets that keep the running
episodes, ends that free their environments, and an episode asked about without an answer counted as lost."""

from __future__ import annotations

from m2flow.envs.text.batch import EnvStep
from m2flow.workers.agentic.turns import EpisodeSpec
from m2flow.workflows.agentic.sides import EnvWorkers, RolloutRanks


class Calls:
    """An env round that records each call; env worker 1 answers nothing for episode 11 (it was restarted
    and holds none of it)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, calls):
        self.calls.append(calls)
        # args[0]: the ids reset, or the actions stepped by id
        answered = {e: {t: EnvStep(f"obs {t}") for t in args[0] if t != 11}
                    for e, (method, args) in calls.items() if method != "env_stop"}
        return answered, []


SPECS = [EpisodeSpec(10, 0, 5, 0), EpisodeSpec(11, 0, 5, 1), EpisodeSpec(20, 5, 6, 0)]


def test_partial_env_workers_reset_only_the_new_episodes_free_the_ended_and_count_the_unanswered_as_lost():
    calls = Calls()
    envs = EnvWorkers(calls, SPECS, keep_running=True)
    first, lost = envs.reset([10, 20])
    assert sorted(first) == [10, 20] and lost == [] and calls.calls[0] == {0: ("env_reset_more", ([10, 20], [5, 6]))}
    answers, lost = envs.step({10: "a", 11: "b"})
    assert sorted(answers) == [10] and lost == [11]  # its env worker holds it no more: played again from its reset
    envs.end([10, 20])
    assert calls.calls[-1] == {0: ("env_stop", ([10, 20],))}


def test_without_partial_rollouts_an_end_sends_nothing():
    calls = Calls()
    EnvWorkers(calls, SPECS).end([10])
    assert calls.calls == []


def test_partial_groups_are_routed_by_their_place_in_their_batch():
    class NoGroup:  # only the routing is asked
        pass

    ranks = RolloutRanks(NoGroup(), 2, SPECS, 1.0, groups_per_step=4)
    assert [ranks.rank_of(EpisodeSpec(0, slot, 0, 0)) for slot in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    odd = RolloutRanks(NoGroup(), 2, SPECS, 1.0, groups_per_step=3)  # batch b's group g on rank g mod 2
    assert [odd.rank_of(EpisodeSpec(0, slot, 0, 0)) for slot in range(6)] == [0, 1, 0, 0, 1, 0]


def test_with_async_steps_a_step_gives_back_what_came_keeps_the_rest_awaited_and_counts_the_vanished_as_lost():
    out = {20}  # env worker 0 holds episode 20's step out at first

    def exchange(calls):
        answered = {}
        for e, (method, (actions, linger)) in calls.items():
            assert method == "env_exchange" and linger >= 0.0
            if e == 0:
                answered[0] = ({t: EnvStep(f"obs {t}") for t in [*actions, 20] if t not in out},
                               sorted(t for t in out if t in [*actions, 20]))
            else:  # env worker 1 was restarted: it holds nothing, answers nothing
                answered[1] = ({}, [])
        calls_seen.append(calls)
        return answered, []

    calls_seen: list[dict] = []
    envs = EnvWorkers(exchange, SPECS, keep_running=True, overlap=True)
    answers, lost = envs.step({10: "a", 20: "b", 11: "c"})
    assert sorted(answers) == [10] and lost == [11] and envs.awaiting == {20}
    out.clear()
    answers, lost = envs.step({10: "d"})  # 20 is asked about again though given no action
    assert sorted(answers) == [10, 20] and lost == [] and envs.awaiting == set()
    assert calls_seen[-1] == {0: ("env_exchange", ({10: "d"}, calls_seen[-1][0][1][1]))}
    # the next iteration's loop takes over the steps still out; a reset drops an episode's step
    again = EnvWorkers(exchange, SPECS, keep_running=True, overlap=True, awaiting=[20])
    assert again.awaiting == {20}
    again.env_round = Calls()
    again.reset([20])
    assert again.awaiting == set()
