"""``TextEnvs``: a reset that leaves the running episodes alone (partial rollouts) starts new ones in free
environments only."""

from __future__ import annotations

from m2flow.envs.text.batch import TextEnvBatch
from m2flow.envs.text.guess import GuessNumber
from m2flow.workers.agentic.env_worker import TextEnvs

import pytest


def test_a_reset_that_keeps_the_running_episodes_takes_free_environments_only():
    envs = TextEnvs(TextEnvBatch(lambda: GuessNumber(high=8, max_turns=3), 3, step_timeout_s=None))
    envs.env_reset([1, 2], [5, 6])
    envs.env_step({1: "0", 2: "0"})  # both running (0 is never the secret), one turn in
    secret = envs.envs.envs[envs._slots[1]].secret
    envs.env_stop([2])  # episode 2 ended: its environment is free again
    first = envs.env_reset_more([3, 4], [7, 8])
    assert sorted(first) == [3, 4] and envs._slots[1] not in {envs._slots[3], envs._slots[4]}
    kept = envs.envs.envs[envs._slots[1]]
    assert kept.turns == 1 and kept.secret == secret  # episode 1 went on untouched
    assert envs.env_step({1: "0"})[1].observation == "higher" and kept.turns == 2
    with pytest.raises(ValueError, match="more episodes"):
        envs.env_reset_more([5], [9])  # three environments, three held
    envs.env_reset_more([1], [5])  # an id that holds one starts over in it
    assert envs.envs.envs[envs._slots[1]].turns == 0


class _Waits(GuessNumber):
    """Guess-the-number whose steps wait ``wait_s[seed]`` seconds (a tool with latency)."""

    wait_s = {5: 0.0, 6: 0.6}

    def reset(self, seed=None):
        self.wait = self.wait_s.get(int(seed or 0), 0.0)
        return super().reset(seed)

    def step(self, action):
        import time

        time.sleep(self.wait)
        return super().step(action)


def test_an_exchange_gives_the_answers_that_came_and_names_the_steps_still_out():
    envs = TextEnvs(TextEnvBatch(lambda: _Waits(high=8, max_turns=3), 2, step_timeout_s=10.0, concurrent=True))
    envs.env_reset([1, 2], [5, 6])
    answers, out = envs.env_exchange({1: "0", 2: "0"})
    assert list(answers) == [1] and answers[1].observation == "higher" and out == [2]
    answers, out = envs.env_exchange({1: "0"})  # episode 1 plays on; 2's step is still out
    assert list(answers) == [1] and out == [2]
    answers, out = envs.env_exchange({9: "0"})  # an id this worker does not hold: neither answered nor out
    assert list(answers) == [2] and out == []
