"""PyTorch's flight recorder on gloo ranks (torch 2.13 records gloo's collectives too), and the match
of the ranks' entries that names the collective they disagree on (``measure.flight_recorder``)."""

from __future__ import annotations

from playbook.measure.flight_recorder import first_mismatch


def entry(seq, op, size, group="1"):
    return {"group": group, "seq": seq, "op": op, "input_sizes": [[size]], "state": "scheduled"}


def test_the_match_names_the_first_collective_the_ranks_disagree_on():
    same = [entry(1, "gloo:all_reduce", 4)]
    assert first_mismatch([same, same]) is None
    other_op = [[*same, entry(2, "gloo:all_reduce", 4)], [*same, entry(2, "gloo:all_gather", 4)]]
    assert first_mismatch(other_op) == (
        "group 1, collective #2: rank 0 in gloo:all_reduce of [[4]], rank 1 in gloo:all_gather of [[4]]"
    )
    other_size = [[entry(1, "gloo:all_reduce", 4)], [entry(1, "gloo:all_reduce", 8)]]
    assert "rank 1 in gloo:all_reduce of [[8]]" in first_mismatch(other_size)
    missing = [[*same, entry(2, "gloo:broadcast", 4)], same]
    assert first_mismatch(missing).endswith("rank 1 never got there")
    assert first_mismatch([[entry(1, "a", 4, "7")], [entry(1, "b", 4, "7")]], group="1") is None  # another group


def _out_of_order(ctx, swap):
    import datetime

    import torch
    import torch.distributed as dist

    from playbook.measure import flight_recorder

    flight_recorder.enable()
    group = dist.new_group(list(range(ctx.world_size)), timeout=datetime.timedelta(seconds=1))
    x = torch.ones(4)  # [4]
    dist.all_reduce(x, group=group)
    try:
        if ctx.rank == 0 or not swap:
            dist.all_reduce(x, group=group)
        else:
            dist.all_gather([torch.empty(4) for _ in range(ctx.world_size)], x, group=group)
    except RuntimeError:  # gloo's timeout: the mismatched collective never completes
        pass
    name = str(dist.distributed_c10d._get_process_group_name(group))
    return [e for e in flight_recorder.recorded() if e["group"] == name]


def test_on_gloo_ranks_the_recorder_sees_both_collectives_and_the_match_names_the_swap(ranks2):
    swapped = ranks2.run(_out_of_order, True)
    assert [e["op"] for e in swapped[0]] == ["gloo:all_reduce", "gloo:all_reduce"]
    assert [e["op"] for e in swapped[1]] == ["gloo:all_reduce", "gloo:all_gather"]
    assert "collective #2: rank 0 in gloo:all_reduce of [[4]], rank 1 in gloo:all_gather" in first_mismatch(swapped)
    assert first_mismatch(ranks2.run(_out_of_order, False)) is None
