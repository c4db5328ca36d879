"""The layout (``ParallelDims``, pure) and the runtime mesh on real ranks: groups, coordinates,
group-local <-> global ranks, axis labels in the trace."""

import pytest
import torch
import torch.distributed as dist

from playbook.config import ModelConfig
from playbook.dims import AXES, GROUP_AXES, ParallelDims, layouts


# ---- the layout, pure -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dims",
    [
        ParallelDims(dp=2, tp=2, pp=2),
        ParallelDims(dp=3, cp=2, tp=2),
        ParallelDims(dp=4, ep=2),
        ParallelDims(dp=2, cp=2, ep=4),
        ParallelDims(pp=3, tp=2),
    ],
)
def test_coordinates_round_trip_and_every_axis_partitions_the_world(dims):
    for r in range(dims.world):
        assert dims.rank(**{a: dims.coords(r)[a] for a in AXES}) == r
    for axis in GROUP_AXES:
        groups = dims.groups(axis)
        members = sorted(r for g in groups for r in g)
        assert members == list(range(dims.world)), axis  # every rank in exactly one group
        assert all(len(g) == dims.size(axis) for g in groups), axis
        for g in groups:
            for r in g:
                assert dims.ranks_along(axis, r) == g  # every member sees the same group, same order


def test_tp_varies_fastest_then_cp_then_dp_then_pp():
    d = ParallelDims(dp=2, tp=2, pp=2, cp=2)
    assert d.ranks_along("tp", 0) == [0, 1]
    assert d.ranks_along("cp", 0) == [0, 2]
    assert d.ranks_along("dp", 0) == [0, 4]
    assert d.ranks_along("pp", 0) == [0, 8]
    assert d.ranks_along("dp_cp", 1) == [1, 3, 5, 7]  # same tp and pp index, every (dp, cp)


def test_expert_groups_are_consecutive_data_ranks_and_replicas_stride_by_ep():
    d = ParallelDims(dp=4, ep=2)  # as the expert-parallel chapter lays out 4 ranks
    assert d.groups("ep") == [[0, 1], [2, 3]]
    assert d.groups("ep_replica") == [[0, 2], [1, 3]]
    d = ParallelDims(dp=2, tp=2, ep=2)
    assert d.groups("ep") == [[0, 2], [1, 3]]  # inside dp, at fixed tp
    assert d.coords(2)["ep"] == 1


def test_table_and_describe_list_every_group():
    d = ParallelDims(dp=2, tp=2, pp=2)
    rows = d.table()
    assert len(rows) == 8 and rows[5] == {
        "rank": 5,
        "tp": 1,
        "cp": 0,
        "dp": 0,
        "pp": 1,
        "tp group": [4, 5],
        "dp group": [5, 7],
        "pp group": [1, 5],
        "dp_cp group": [5, 7],
    }
    text = d.describe()
    assert "tp         size 2: [0, 1] [2, 3] [4, 5] [6, 7]" in text and "pp         size 2: [0, 4] [1, 5]" in text
    assert str(d) == "dp2×tp2×pp2" and str(ParallelDims()) == "single"


def test_layouts_enumerates_every_factorisation():
    found = {str(d) for d in layouts(4)}
    assert found == {"dp4", "tp4", "pp4", "cp4", "dp2×tp2", "dp2×pp2", "dp2×cp2", "tp2×pp2", "tp2×cp2", "pp2×cp2"}


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(dp=0), "dp must be a positive integer"),
        (dict(dp=3, ep=2), "ep=2 must divide dp·cp=3"),
    ],
)
def test_bad_degrees_name_the_constraint(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ParallelDims(**kwargs)


@pytest.mark.parametrize(
    "dims, kwargs, words",
    [
        (ParallelDims(tp=4), {}, r"tp=4 must divide kv_heads=2; tp in \{1, 2\}"),
        (ParallelDims(pp=8), {}, "pp=8 is more stages than the model's 2 layers"),
        (ParallelDims(dp=2, ep=2), {}, "needs a mixture-of-experts model"),
        (ParallelDims(cp=2), dict(seq_len=30, zigzag=True), "seq_len=30 must split into 4 equal chunks"),
        (
            ParallelDims(dp=2, pp=2),
            dict(global_batch=6, microbatches=2),
            "global_batch=6 does not split over dp·microbatches",
        ),
    ],
)
def test_a_layout_that_does_not_fit_the_model_is_refused_before_ranks_start(dims, kwargs, words):
    with pytest.raises(ValueError, match=words):
        dims.check(ModelConfig.preset("gpt-tiny"), **kwargs)


def test_expert_degree_must_divide_the_experts():
    cfg = ModelConfig.preset("gpt-tiny-moe")
    ParallelDims(dp=2, ep=2).check(cfg)
    with pytest.raises(ValueError, match=f"must divide n_experts={cfg.n_experts}"):
        ParallelDims(dp=cfg.n_experts + 1, ep=cfg.n_experts + 1).check(cfg)


# ---- the mesh on real ranks ---------------------------------------------------------------------
def probe(ctx, dims):
    """Sum each rank's number over every axis's group; record the mesh's view of itself."""
    mesh = ctx.mesh_for(dims)
    sums = {}
    for axis in GROUP_AXES:
        t = torch.tensor([float(ctx.rank)])
        dist.all_reduce(t, group=mesh.group(axis))
        sums[axis] = t.item()
    axes = [s.axis for s in ctx.tracer.spans if s.kind == "comm"]
    again = ctx.mesh_for(dims) is mesh  # cached: no new groups on a second call
    return {
        "sums": sums,
        "coords": mesh.coords,
        "axes": axes,
        "cached": again,
        "pp_peer": mesh.global_rank("pp", 1 - mesh.index("pp")) if dims.pp == 2 else None,
    }


def test_mesh_groups_on_eight_real_ranks_match_the_layout(ranks8):
    dims = ParallelDims(dp=2, tp=2, pp=2)
    out = ranks8.run(probe, dims)
    for r, got in enumerate(out):
        assert got["coords"] == dims.coords(r)
        for axis in GROUP_AXES:
            assert got["sums"][axis] == sum(dims.ranks_along(axis, r)), (r, axis)
        assert got["cached"]
        assert got["pp_peer"] == dims.ranks_along("pp", r)[1 - dims.coords(r)["pp"]]  # the other stage, globally
        # labels: dp_cp is the dp group here (cp=1), ep_replica too; size-1 axes are unlabelled
        assert got["axes"] == ["tp", "", "dp", "pp", "dp", "", "dp"]
    again = ranks8.run(probe, dims)  # a second call reuses the same groups
    assert [g["sums"] for g in again] == [g["sums"] for g in out]


def test_a_layout_for_another_world_size_is_refused_on_the_ranks(ranks2):
    from playbook.cluster import RankError

    with pytest.raises(RankError, match="needs 8 ranks but this world has 2"):
        ranks2.run(probe, ParallelDims(dp=2, tp=2, pp=2))


def groups_of_my_own(ctx):
    import torch.distributed as dist

    for n in (1, 2, 4):  # as chapter 1's scaling run does: plain new_group calls before any mesh
        dist.new_group(list(range(n)))
    return True


def test_a_mesh_after_other_groups_were_made_does_not_hang(ranks4):
    """Regression: groups made by their members alone (use_local_synchronization) hung on gloo once
    the world had created other groups; every group is now created by the whole world, in order."""
    ranks4.run(groups_of_my_own)
    dims = ParallelDims(dp=2, cp=2, ep=2)
    out = ranks4.run(probe, dims, timeout=20)
    assert [o["coords"] for o in out] == [dims.coords(r) for r in range(4)]
