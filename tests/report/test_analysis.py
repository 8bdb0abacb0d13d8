"""Report analysis on hand-built timelines: innermost segments, attribution, device use, bubbles."""

from __future__ import annotations

import pytest

from m2flow.report.analysis import (
    IDLE,
    Segment,
    analyse,
    attribute,
    component_priority,
    gaps,
    innermost_segments,
    union_length,
)
from m2flow.report.load import RunData, Span, Track


def S(start, end, cat, **args):
    return Span(start, end, cat, cat, args)


def test_innermost_segments_label_each_instant_by_the_deepest_span():
    spans = [S(0, 10, "train"), S(2, 4, "wait_lock"), S(6, 7, "onload"), S(12, 13, "train")]
    assert innermost_segments(spans) == [
        Segment(0, 2, "train"), Segment(2, 4, "wait_lock"), Segment(4, 6, "train"),
        Segment(6, 7, "onload"), Segment(7, 10, "train"), Segment(12, 13, "train")]


def test_a_child_sticking_out_of_its_parent_is_clipped():
    assert innermost_segments([S(0, 5, "a"), S(3, 8, "b")]) == [Segment(0, 3, "a"), Segment(3, 5, "b")]


def test_union_and_gaps():
    iv = [(0, 2), (1, 3), (5, 6)]
    assert union_length(iv) == 4
    assert gaps(iv, 0, 8) == [(3, 5), (6, 8)]
    assert gaps([], 1, 2) == [(1, 2)]
    assert gaps([(0, 10)], 2, 5) == []


def test_priority_puts_waits_last_and_busiest_first():
    assert component_priority({"wait_lock": 50.0, "reward": 1.0, "train": 9.0, "generate": 12.0}) == [
        "generate", "train", "reward", "wait_lock"]


def test_attribution_gives_each_instant_to_one_component_and_sums_to_the_window():
    segs = [Segment(0, 6, "generate"), Segment(4, 5, "wait_lock"), Segment(5, 9, "train")]
    parts = attribute(segs, 0, 10, ["generate", "train", "wait_lock"])
    assert parts == {"generate": 6, "train": 3, IDLE: 1}
    parts = attribute(segs, 3, 8, ["train", "generate", "wait_lock"])
    assert parts == pytest.approx({"generate": 2, "train": 3})
    assert attribute([], 0, 2, []) == {IDLE: 2}


def _run() -> RunData:
    driver = {"pid": 1, "name": "driver @node0", "group": "driver", "rank": 0, "node_rank": 0, "devices": []}
    gen = {"pid": 2, "name": "gen[0] @node0", "group": "gen", "rank": 0, "node_rank": 0, "devices": [0]}
    train = {"pid": 3, "name": "train[0] @node0", "group": "train", "rank": 0, "node_rank": 0, "devices": [1]}
    return RunData(
        run_dir=None,
        tracks=[
            Track(1, 1, driver, [S(0, 10, "step", step=0), S(10, 20, "step", step=1)]),
            Track(2, 1, gen, [S(0, 6, "generate"), S(10, 16, "generate")]),
            Track(3, 1, train, [S(4, 9, "train"), S(4, 5, "wait_lock"), S(14, 19, "train")]),
        ],
        counters=[], metrics=[])


def test_analyse_breaks_steps_down_and_measures_devices():
    a = analyse(_run())
    # Busy inside the steps: generate 12, train 4 + 5 (the lock wait is not training), wait 1.
    assert a.busy_by_component == {"generate": 12, "train": 9, "wait_lock": 1}
    assert a.priority == ["generate", "train", "wait_lock"]
    assert [(s.index, s.start, s.end) for s in a.steps] == [(0, 0, 10), (1, 10, 20)]
    assert [s.parts for s in a.steps] == [{"generate": 6, "train": 3, IDLE: 1}] * 2
    assert a.totals() == {"generate": 12, "train": 6, IDLE: 2}
    assert sum(a.totals().values()) == a.total_time == 20
    dev0, dev1 = a.devices
    assert (dev0.label, dev0.processes, dev0.busy, dev0.window) == ("node0/dev0", ["gen[0]"], 12, 20)
    assert dev0.bubbles == [(6, 10), (16, 20)]
    assert dev1.busy_fraction == pytest.approx(0.45)
    assert dev1.bubbles == [(0, 5), (9, 10), (10, 14), (19, 20)]
    assert dev1.bubble_time == 11


def test_skip_and_bubble_threshold():
    a = analyse(_run(), skip=1, bubble_threshold=2.0)
    assert [s.index for s in a.steps] == [1]
    assert a.devices[1].bubbles == [(10, 14)]  # the 1 s gaps are under the threshold


def test_without_step_markers_the_whole_trace_is_one_window():
    run = _run()
    run.tracks = run.tracks[1:]
    a = analyse(run)
    assert [(s.start, s.end) for s in a.steps] == [(0, 19)]
    assert sum(a.steps[0].parts.values()) == 19
