"""The rank grid in megatron-core's ``tp-cp-ep-dp-pp`` order: pure checks (milliseconds)."""

from __future__ import annotations

import itertools

import pytest

from labkit.errors import ConfigError
from labkit.planner import rank_grid


def test_megatron_parallel_state_docstring_example():
    # megatron/core/parallel_state.py, initialize_model_parallel's docstring: 16 GPUs,
    # tensor_model_parallel_size 2, pipeline_model_parallel_size 4 ->
    # 8 TP groups [g0, g1], [g2, g3], ..., 8 DP groups [g0, g2], [g1, g3], [g4, g6], ...,
    # 4 PP groups [g0, g4, g8, g12], [g1, g5, g9, g13], [g2, ...], [g3, ...].
    g = rank_grid(16, tp=2, pp=4, gpus_per_node=8)
    assert g.dp == 2
    assert g.tp_groups == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert g.dp_groups == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert g.pp_groups == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]


def _brute_force(world, tp, pp, cp):
    """Every rank's coordinates by nested loops in megatron's order (PP outermost, TP innermost)."""
    dp = world // (tp * cp * pp)
    coords = {}
    rank = 0
    for p, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp)):
        coords[rank] = {"tp": t, "cp": c, "dp": d, "pp": p}
        rank += 1
    return coords


@pytest.mark.parametrize("world,tp,pp,cp", [(w, t, p, c) for w in (1, 2, 4, 6, 8, 12, 16)
                                              for t in (1, 2, 3, 4) for p in (1, 2, 3, 4)
                                              for c in (1, 2) if w % (t * p * c) == 0])
def test_grid_matches_brute_force_enumeration(world, tp, pp, cp):
    g = rank_grid(world, tp=tp, pp=pp, gpus_per_node=4, cp=cp)
    expected = _brute_force(world, tp, pp, cp)
    for r in range(world):
        assert g.coords(r) == expected[r]
        assert g.rank(**expected[r]) == r
    # Groups partition the ranks, and a group varies exactly one coordinate.
    for axis, groups in g.groups().items():
        assert sorted(r for grp in groups for r in grp) == list(range(world))
        for grp in groups:
            others = {tuple(v for k, v in expected[r].items() if k != axis) for r in grp}
            assert len(others) == 1
            assert [expected[r][axis] for r in grp] == list(range(len(grp)))


def test_node_of_and_groups_crossing_nodes():
    # 2 nodes x 2 GPUs, TP=2 x PP=2: TP pairs stay inside a node, PP pairs cross.
    g = rank_grid(4, tp=2, pp=2, gpus_per_node=2)
    assert [g.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    crossing = g.groups_crossing_nodes()
    assert crossing["tp"] == [] and crossing["pp"] == [[0, 2], [1, 3]] and crossing["dp"] == []
    assert not g.crosses_nodes("tp") and g.crosses_nodes("pp")
    # TP=4 on 2 GPUs per node: the TP group crosses (what the planner flags).
    g4 = rank_grid(4, tp=4, pp=1, gpus_per_node=2)
    assert g4.groups_crossing_nodes()["tp"] == [[0, 1, 2, 3]] and g4.crosses_nodes("tp")


@pytest.mark.parametrize("world,tp,pp,gpn", [(w, t, p, n) for w in (4, 6, 8, 12, 24)
                                             for t in (1, 2, 3, 4) for p in (1, 2, 3)
                                             for n in (1, 2, 3, 4, 8) if w % (t * p) == 0])
def test_crosses_nodes_fast_path_agrees_with_group_lists(world, tp, pp, gpn):
    g = rank_grid(world, tp=tp, pp=pp, gpus_per_node=gpn)
    crossing = g.groups_crossing_nodes()
    for axis in ("tp", "dp", "pp"):
        assert g.crosses_nodes(axis) == bool(crossing[axis])


def test_to_frame_and_render():
    g = rank_grid(8, tp=2, pp=2, gpus_per_node=4)
    df = g.to_frame()
    assert list(df["rank"]) == list(range(8))
    assert list(df["node"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(df["tp_rank"]) == [0, 1] * 4
    assert list(df["dp_rank"]) == [0, 0, 1, 1] * 2
    assert list(df["pp_rank"]) == [0] * 4 + [1] * 4
    # Ranks sharing a tp_group index are exactly one TP group.
    assert sorted(df.groupby("tp_group")["rank"].apply(list).tolist()) == g.tp_groups
    text = g.render()
    assert "node 1: r4(t0 d0 p1)" in text and "TP fastest" in text


@pytest.mark.parametrize("args,needle", [
    ((6, 4, 1, 2), "TP x CP x PP = 4 x 1 x 1 = 4 does not divide world_size 6"),
    ((4, 0, 1, 2), "tp=0 must be a positive integer"),
])
def test_bad_sizes_name_the_numbers(args, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        rank_grid(*args)
