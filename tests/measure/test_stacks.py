"""Stacks dumped while a rank waits (``measure.stacks``): in this process, and on real ranks stuck in
two different collectives, where the dump names the collective each rank is in."""

from __future__ import annotations

import time

from playbook.measure.stacks import dump_after, main_frames


def _waits_here():
    time.sleep(0.3)


def test_a_block_still_running_is_dumped_with_its_innermost_frame_first():
    with dump_after(0.05) as dump:
        _waits_here()
    assert dump.frames[0][2] == "_waits_here", dump.text
    assert dump.frames[1][2] == "test_a_block_still_running_is_dumped_with_its_innermost_frame_first"
    with dump_after(5) as quick:
        pass
    assert quick.text == "" and quick.frames == []  # ended before the timer: nothing dumped
    assert main_frames(dump.text, ident=1) == []  # no such thread


def _stuck(ctx):
    import datetime

    import torch
    import torch.distributed as dist

    from playbook.measure.stacks import dump_after

    group = dist.new_group(list(range(ctx.world_size)), timeout=datetime.timedelta(seconds=1))
    x = torch.ones(4)  # [4]
    with dump_after(0.3) as dump:
        try:
            if ctx.rank == 0:
                dist.all_reduce(x, group=group)
            else:
                dist.all_gather([torch.empty(4) for _ in range(ctx.world_size)], x, group=group)
        except RuntimeError:  # gloo's timeout
            pass
    return [f for _, _, f in dump.frames]


def test_on_real_ranks_each_dump_names_the_collective_its_rank_waits_in(ranks2):
    funcs = ranks2.run(_stuck, timeout=60)
    assert funcs[0][0] == "all_reduce" and funcs[1][0] == "all_gather", funcs
    assert all("_stuck" in f for f in funcs), funcs  # and the line of ours that called it
