"""Combining the metrics of a group's ranks."""

from m2flow.workers.stats import WEIGHT_KEY, merge_rank_metrics


def test_means_are_weighted_counts_add_up_and_times_take_the_slowest_rank():
    parts = [
        {"reward/mean": 1.0, "reward/timeouts_count": 2.0, "time/reward": 0.5, WEIGHT_KEY: 3.0},
        {"reward/mean": 0.0, "reward/timeouts_count": 1.0, "time/reward": 0.75, WEIGHT_KEY: 1.0},
    ]
    out = merge_rank_metrics(parts)
    assert out == {"reward/mean": 0.75, "reward/timeouts_count": 3.0, "time/reward": 0.75, WEIGHT_KEY: 4.0}


def test_ranks_without_samples_get_a_plain_mean():
    out = merge_rank_metrics([{"x/y": 1.0, WEIGHT_KEY: 0.0}, {"x/y": 3.0, WEIGHT_KEY: 0.0}])
    assert out["x/y"] == 2.0
