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
