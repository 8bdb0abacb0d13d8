"""Placement strings -> per-rank devices, mode detection, and the errors users hit."""

import pytest

from m2flow.runtime.placement import NodeLayout, PlacementError, parse_placement, split_spec

ONE_NODE = NodeLayout((8,))
TWO_NODES = NodeLayout((4, 4), {"sim": (1,), "train": (0,)})


def devs(plan, comp):
    return [r.global_devices for r in plan[comp].ranks]


def test_split_spec_reads_rlinf_style_strings():
    assert split_spec("actor,rollout: 0-3, env: 4-7") == {"actor,rollout": "0-3", "env": "4-7"}
    assert split_spec("actor:0-3,env:4-7") == {"actor": "0-3", "env": "4-7"}
    assert split_spec("env: 0-1:0-3, 2-3:4-7") == {"env": "0-1:0-3, 2-3:4-7"}
    assert split_spec("all") == {"*": "all"}


def test_disaggregated_one_rank_per_device():
    plan = parse_placement("actor,rollout: 0-3, env: 4-7", ONE_NODE)
    assert devs(plan, "actor") == [(0,), (1,), (2,), (3,)]
    assert devs(plan, "rollout") == devs(plan, "actor")
    assert devs(plan, "env") == [(4,), (5,), (6,), (7,)]
    # actor and rollout share 0-3 but env is apart: neither all-shared nor all-disjoint.
    assert plan.mode == "hybrid"
    assert parse_placement("actor: 0-3, env: 4-7", ONE_NODE).mode == "disaggregated"


def test_all_expands_to_every_component_and_is_collocated():
    plan = parse_placement("all", ONE_NODE, components=["actor", "rollout", "env"])
    assert set(plan.components) == {"actor", "rollout", "env"}
    assert devs(plan, "env") == [(d,) for d in range(8)]
    assert plan.mode == "collocated"


def test_several_processes_per_device():
    plan = parse_placement("env: 0-1:0-3", ONE_NODE)
    assert devs(plan, "env") == [(0,), (0,), (1,), (1,)]
    assert [r.rank for r in plan["env"].ranks] == [0, 1, 2, 3]


def test_several_devices_per_process():
    plan = parse_placement("actor: 0-3:0-1", ONE_NODE)
    assert devs(plan, "actor") == [(0, 1), (2, 3)]


def test_multi_item_component_continues_rank_numbering():
    plan = parse_placement("env: 0-1, 4-5", ONE_NODE)
    assert devs(plan, "env") == [(0,), (1,), (4,), (5,)]
    plan = parse_placement("env: 0-1:0-3, 2-3:4-7", ONE_NODE)
    assert devs(plan, "env") == [(0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)]


def test_hybrid_nested_is_allowed():
    plan = parse_placement("actor: 0-7, env: 0-3, rollout: 4-7", ONE_NODE)
    assert plan.mode == "hybrid"


def test_devices_map_to_nodes():
    plan = parse_placement("actor: 0-7", TWO_NODES)
    assert [(r.node_rank, r.local_devices) for r in plan["actor"].ranks][3:5] == [(0, (3,)), (1, (0,))]


def test_node_groups():
    plan = parse_placement("env: 0-3@sim, actor: 0-1@train", TWO_NODES)
    assert {r.node_rank for r in plan["env"].ranks} == {1}
    assert [r.local_devices for r in plan["env"].ranks] == [(0,), (1,), (2,), (3,)]
    assert {r.node_rank for r in plan["actor"].ranks} == {0}
    assert plan.mode == "disaggregated"


def test_mapping_form_equals_string_form():
    a = parse_placement({"actor,rollout": "0-3", "env": "4-7"}, ONE_NODE)
    b = parse_placement("actor,rollout: 0-3, env: 4-7", ONE_NODE)
    assert a == b


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("actor: 0-9", "device 9"),
        ("actor: 0-8", "0-7 exist"),
        ("actor: 3-1", "below start"),
        ("actor: ", "empty device list"),
        ("actor: 0-3, actor: 4-7", "listed twice"),
        ("actor: 0-3, rollout,actor: 4-7", "placed twice"),
        ("env: 0-2:0-3", "cannot be spread evenly"),
        ("env: 0-2:0-1", "cannot be split evenly"),
        ("env: 0-1:0-1, 2-3:1-2", "rank 1 is placed twice"),
        ("env: 0-1:0-1, 2-3:3-4", "without gaps"),
        ("actor: 0-5, rollout: 3-7", "partly overlap"),
        ("0-3", "cannot read placement"),
        ("", "empty placement"),
        ("actor: 0-3@nope", "unknown node group"),
        ("actor: x-y", "bad device range"),
    ],
)
def test_errors_name_the_problem(spec, fragment):
    layout = NodeLayout((8,), {"sim": (0,)})
    with pytest.raises(PlacementError, match=fragment):
        parse_placement(spec, layout)


def test_rank_may_not_span_nodes():
    with pytest.raises(PlacementError, match="span nodes"):
        parse_placement("actor: 2-5:0", TWO_NODES)


def test_component_list_is_checked():
    with pytest.raises(PlacementError, match=r"unknown component\(s\) \['critic'\]"):
        parse_placement("actor: 0-3, critic: 4-7", ONE_NODE, components=["actor"])
    with pytest.raises(PlacementError, match=r"misses component\(s\) \['env'\]"):
        parse_placement("actor: 0-3", ONE_NODE, components=["actor", "env"])
    with pytest.raises(PlacementError, match="needs the list of components"):
        parse_placement("all", ONE_NODE)


def test_unknown_component_lookup_lists_placed():
    plan = parse_placement("actor: 0-3", ONE_NODE)
    with pytest.raises(PlacementError, match=r"placed: \['actor'\]"):
        plan["env"]


def test_device_table_is_lazy_for_a_huge_syntax_layout() -> None:
    """Checking syntax against an unknown cluster must not build one entry per possible device."""
    import tracemalloc

    tracemalloc.start()
    plan = parse_placement("a: 0-3, b: 4", NodeLayout((1 << 30,)), ["a", "b"])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert plan["a"].devices == frozenset({(0, 0), (0, 1), (0, 2), (0, 3)})
    assert plan["b"].devices == frozenset({(0, 4)})
    assert peak < 10_000_000


def test_device_table_maps_across_nodes() -> None:
    table = NodeLayout((2, 3)).device_table(None)
    assert len(table) == 5
    assert [table[i] for i in range(5)] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    with pytest.raises(IndexError):
        table[5]


def test_local_is_every_component_once_on_device_zero() -> None:
    plan = parse_placement(" local ", NodeLayout((4,)), ["actor", "rollout"])
    assert plan.mode == "collocated"
    assert {c: [(r.rank, r.node_rank, r.local_devices) for r in plan[c].ranks] for c in plan.components} == {
        "actor": [(0, 0, (0,))], "rollout": [(0, 0, (0,))]}
    with pytest.raises(PlacementError, match="needs the list of components"):
        parse_placement("local", NodeLayout((4,)))
