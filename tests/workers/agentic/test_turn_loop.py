"""The one turn loop against a scripted policy and scripted environments: turns in order, the turn and token
budgets, episodes ended by their environment, lost environments re-run, no episode lost or ended twice, and
the loop's metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from m2flow.envs.text.batch import EnvStep
from m2flow.workers.agentic.turn_loop import Rounds, play_turns


class ScriptedPolicy:
    """Episode t's turn k is the action ``"t:k"``; the turn budget ends an episode after ``max_turns`` turns,
    and ``cut_at[t] = k`` has the token budget end episode t in its turn k (no action)."""

    def __init__(self, ids: Sequence[int], max_turns: int, cut_at: Mapping[int, int] | None = None) -> None:
        self.max_turns, self.cut_at = max_turns, dict(cut_at or {})
        self.turns = {t: 0 for t in ids}
        self.started: set[int] = set()
        self.done: dict[int, str] = {}
        self.log: list[tuple] = []
        self.reruns: list[int] = []

    def start_episodes(self, first: Mapping[int, EnvStep]) -> list[int]:
        self.log.append(("start", sorted(first)))
        ended = []
        for t, step in first.items():
            assert t not in self.started, f"episode {t} started twice without a re-run"
            self.started.add(t)
            if step.error:
                self.done[t] = "env_error"
                ended.append(t)
        return ended

    def running(self) -> list[int]:
        return [t for t in self.turns if t in self.started and t not in self.done]

    def play_turn(self, round_: int) -> tuple[dict[int, str], list[int]]:
        self.log.append(("turn", round_))
        actions, cut = {}, []
        for t in self.running():
            k = self.turns[t]
            self.turns[t] += 1
            if self.cut_at.get(t) == k:
                self.done[t] = "token_budget"
                cut.append(t)
            else:
                actions[t] = f"{t}:{k}"
        return actions, cut

    def observe(self, results: Mapping[int, EnvStep]) -> list[int]:
        self.log.append(("observe", sorted(results)))
        ended = []
        for t, step in results.items():
            assert t in self.running(), f"an answer for episode {t}, which is not running"
            if step.error:
                self.done[t] = "env_error"
            elif step.terminated:
                self.done[t] = "terminated"
            elif self.turns[t] >= self.max_turns:
                self.done[t] = "turn_budget"
            if t in self.done:
                ended.append(t)
        return ended

    def rerun(self, traj_ids: Sequence[int]) -> None:
        for t in traj_ids:
            assert t in self.running(), f"episode {t} re-run but not running"
            self.turns[t] = 0
            self.started.discard(t)
            self.reruns.append(t)


class ScriptedEnvs:
    """Episode t terminates at its ``solve_at[t]``-th step (never when absent); ``broken_reset`` fail their
    reset; ``lose[(call, t)]``: the environment of t is lost at that step call (0-based), or at that reset
    call with a key ``("reset", n, t)``: no answer."""

    def __init__(self, solve_at: Mapping[int, int] | None = None, broken_reset: Sequence[int] = (),
                 lose: Sequence[tuple] = ()) -> None:
        self.solve_at, self.broken_reset, self.lose = dict(solve_at or {}), set(broken_reset), set(lose)
        self.steps: dict[int, int] = {}
        self.actions: dict[int, list[str]] = {}
        """every action each episode's environment received, in order (a re-run starts a new list)"""
        self.played: dict[int, list[list[str]]] = {}
        """per episode, the actions of each of its plays (a lost one and its re-run)"""
        self.ended: Counter = Counter()
        self.reset_calls = self.step_calls = 0

    def reset(self, traj_ids: Sequence[int]) -> tuple[dict[int, EnvStep], list[int]]:
        n, self.reset_calls = self.reset_calls, self.reset_calls + 1
        lost = [t for t in traj_ids if ("reset", n, t) in self.lose]
        out = {}
        for t in traj_ids:
            if t in lost:
                continue
            self.steps[t] = 0
            self.actions[t] = []
            self.played.setdefault(t, []).append(self.actions[t])
            out[t] = EnvStep("", error="reset raised") if t in self.broken_reset else EnvStep(f"start {t}")
        return out, lost

    def step(self, actions: Mapping[int, str]) -> tuple[dict[int, EnvStep], list[int]]:
        n, self.step_calls = self.step_calls, self.step_calls + 1
        out, lost = {}, []
        for t, action in actions.items():
            assert t not in self.ended, f"episode {t} stepped after it ended"
            self.actions[t].append(action)
            if (n, t) in self.lose:
                lost.append(t)
                continue
            self.steps[t] += 1
            out[t] = EnvStep(f"obs {t}", reward=float(self.steps[t] == self.solve_at.get(t)),
                             terminated=self.steps[t] == self.solve_at.get(t))
        return out, lost

    def end(self, traj_ids: Sequence[int]) -> None:
        self.ended.update(traj_ids)


def _play(ids, policy, envs) -> Rounds:
    rounds = play_turns(policy, envs, ids)
    assert sorted(envs.ended) == sorted(ids) and set(envs.ended.values()) == {1}, "every episode ends exactly once"
    assert sorted(policy.done) == sorted(ids) and not policy.running()
    return rounds


def test_turns_go_in_order_until_each_episode_ends_by_its_environment_or_the_turn_budget():
    ids = [10, 11, 12, 13]
    policy = ScriptedPolicy(ids, max_turns=3)
    envs = ScriptedEnvs(solve_at={10: 1, 11: 2, 12: 3})  # 13 never solves: the turn budget ends it
    rounds = _play(ids, policy, envs)
    assert {t: envs.actions[t] for t in ids} == {10: ["10:0"], 11: ["11:0", "11:1"], 12: ["12:0", "12:1", "12:2"],
                                                  13: ["13:0", "13:1", "13:2"]}
    assert policy.done == {10: "terminated", 11: "terminated", 12: "terminated", 13: "turn_budget"}
    # Each round: one turn of every running episode, then the answers to exactly those that acted.
    assert policy.log == [("start", ids), ("turn", 0), ("observe", ids), ("turn", 1), ("observe", [11, 12, 13]),
                          ("turn", 2), ("observe", [12, 13])]
    assert rounds.rounds == 3 and envs.reset_calls == 1 and envs.step_calls == 3
    metrics = rounds.metrics()
    assert set(metrics) == {"time/env_busy_s", "time/generate_busy_s", "rollout/rounds"}
    assert metrics["rollout/rounds"] == 3.0 and metrics["time/env_busy_s"] >= 0 and metrics["time/generate_busy_s"] >= 0


def test_a_token_budget_cut_and_a_failed_reset_end_episodes_without_a_step():
    ids = [0, 1, 2]
    policy = ScriptedPolicy(ids, max_turns=4, cut_at={1: 1})
    envs = ScriptedEnvs(broken_reset=[2])
    rounds = _play(ids, policy, envs)
    assert envs.actions == {0: ["0:0", "0:1", "0:2", "0:3"], 1: ["1:0"], 2: []}
    assert policy.done == {0: "turn_budget", 1: "token_budget", 2: "env_error"}
    assert rounds.rounds == 4 and policy.log[1:3] == [("turn", 0), ("observe", [0, 1])]


def test_an_episode_whose_environment_is_lost_is_played_again_from_its_start_under_its_id():
    ids = [0, 1, 2]
    policy = ScriptedPolicy(ids, max_turns=3)
    # Episode 1's environment is lost at the second step call, and again at the reset that restarts it.
    envs = ScriptedEnvs(solve_at={0: 2}, lose=[(1, 1), ("reset", 1, 1)])
    rounds = _play(ids, policy, envs)
    assert policy.reruns == [1] and envs.reset_calls == 3  # the first reset, one lost, one that answered
    assert envs.played[1] == [["1:0", "1:1"], ["1:0", "1:1", "1:2"]]  # the lost play, then a whole one
    assert envs.played[0] == [["0:0", "0:1"]] and envs.played[2] == [["2:0", "2:1", "2:2"]]
    assert policy.done == {0: "terminated", 1: "turn_budget", 2: "turn_budget"}
    assert rounds.rounds == 5  # episode 1's second play ran from round 2 to round 4


@pytest.mark.parametrize("n", [1, 7])
def test_no_episode_is_lost_or_ended_twice(n):
    ids = list(range(100, 100 + n))
    policy = ScriptedPolicy(ids, max_turns=4, cut_at={t: t % 5 for t in ids if t % 3 == 0})
    envs = ScriptedEnvs(solve_at={t: 1 + t % 4 for t in ids if t % 2}, lose=[(0, ids[-1])])
    _play(ids, policy, envs)
    assert all(len(acts) <= 4 for acts in envs.actions.values())


def test_a_loop_stopped_at_a_round_boundary_leaves_its_episodes_running_and_the_next_continues_them():
    # Partial rollouts: the first call stops once episode 10 has ended; 11 stays mid-episode on both sides and
    # goes on in the second call (no reset, its turns numbered on) beside the new episode 12.
    policy = ScriptedPolicy([10, 11, 12], max_turns=4)
    envs = ScriptedEnvs(solve_at={10: 1, 11: 3, 12: 1})
    first = play_turns(policy, envs, [10, 11], until=lambda: 10 in policy.done)
    assert first.rounds == 1 and first.open == (11,) and policy.running() == [11] and envs.actions[11] == ["11:0"]
    second = play_turns(policy, envs, [12], running=first.open)
    assert second.open == () and not policy.running()
    assert envs.actions[11] == ["11:0", "11:1", "11:2"] and len(envs.played[11]) == 1  # reset once, played on
    assert sorted(envs.ended) == [10, 11, 12] and set(envs.ended.values()) == {1}
    assert policy.done == {10: "terminated", 11: "terminated", 12: "terminated"}
    assert ("start", [12]) in policy.log and ("start", [11]) not in policy.log


def test_a_loop_whose_stop_holds_at_once_only_starts_its_new_episodes():
    policy = ScriptedPolicy([1, 2], max_turns=2)
    envs = ScriptedEnvs()
    rounds = play_turns(policy, envs, [1, 2], until=lambda: True)
    assert rounds.rounds == 0 and rounds.open == (1, 2) and policy.running() == [1, 2] and envs.step_calls == 0


class WaitingPolicy(ScriptedPolicy):
    """ScriptedPolicy that, as the rollout does, gives no turn to an episode whose last action is unanswered."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.waiting: set[int] = set()

    def running(self) -> list[int]:
        return [t for t in super().running() if t not in self.waiting]

    def play_turn(self, round_: int) -> tuple[dict[int, str], list[int]]:
        actions, cut = super().play_turn(round_)
        self.waiting.update(actions)
        return actions, cut

    def observe(self, results: Mapping[int, EnvStep]) -> list[int]:
        self.waiting.difference_update(results)
        return super().observe(results)


class LateEnvs(ScriptedEnvs):
    """ScriptedEnvs whose episode t answers a step only ``late[t]`` step calls after it was sent (async steps),
    or sooner when nothing else is there to answer."""

    def __init__(self, late: Mapping[int, int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.late, self.due = dict(late), {}

    def step(self, actions):
        n = self.step_calls
        answers, lost = super().step(actions)
        for t, step in answers.items():
            self.due[t] = (n + self.late.get(t, 0), step)
        ready = {t: s for t, (at, s) in self.due.items() if at <= n}
        if not ready and self.due:  # as an env worker does, wait for the next answer rather than give none
            t = min(self.due, key=lambda t: self.due[t][0])
            ready = {t: self.due[t][1]}
        for t in ready:
            del self.due[t]
        return ready, lost


def test_with_steps_that_answer_late_the_others_play_on_and_every_episode_ends_once():
    ids = [0, 1, 2]
    policy = WaitingPolicy(ids, max_turns=3)
    envs = LateEnvs(late={1: 3}, solve_at={0: 3, 2: 2})  # episode 1's answers come three rounds late
    rounds = _play(ids, policy, envs)
    # episode 0 played its three turns while 1 waited for its first answer
    assert envs.actions[0] == ["0:0", "0:1", "0:2"] and envs.actions[1][:1] == ["1:0"]
    assert policy.log[:5] == [("start", ids), ("turn", 0), ("observe", [0, 2]), ("turn", 1), ("observe", [0, 2])]
    assert policy.done == {0: "terminated", 1: "turn_budget", 2: "terminated"}
    assert rounds.rounds > 3


def test_a_loop_with_no_turn_to_play_and_no_answer_coming_stops_with_an_error():
    class Forgetful(ScriptedEnvs):
        def step(self, actions):  # takes the actions, never answers, reports nothing lost
            super().step(actions)
            return {}, []

    policy = WaitingPolicy([0], max_turns=3)
    envs = Forgetful()
    with pytest.raises(RuntimeError, match="stalled"):
        play_turns(policy, envs, [0])
