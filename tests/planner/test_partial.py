"""What the planner knows of partial rollouts: how far the rollout runs ahead, and the lines that say how it is priced."""

from __future__ import annotations

import pytest

from m2flow.planner.partial import partial_notes, run_ahead


@pytest.mark.parametrize("staleness,partial,ahead", [(0, False, 0), (1, False, 1), (3, False, 3),
                                                     (1, True, 0), (2, True, 1), (3, True, 2), (0, True, 0)])
def test_partial_rollouts_run_one_iteration_less_ahead(staleness, partial, ahead):
    assert run_ahead(staleness, partial) == ahead


def test_the_notes_say_how_far_ahead_and_that_generation_is_priced_as_measured():
    assert partial_notes(False, 2) == ()
    ahead, priced = partial_notes(True, 2, "episodes")
    assert ahead.startswith("rollout.partial: episodes unfinished") and "generates 1 iteration(s) ahead, not 2" in ahead
    assert "priced as the profile measured it" in priced and "finish first" in priced
