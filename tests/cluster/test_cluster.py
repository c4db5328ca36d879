"""The launcher on real processes: results, errors, hangs, interrupts, and nothing left behind."""

import _thread
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from playbook.cluster import RankError, Ranks, RankTimeout, check_world_size, launch, max_local_ranks
from tests.conftest import pid_alive


def wait_gone(pids, seconds=10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


CELL = """
import torch
import torch.distributed as dist

def cell_function(ctx, scale):
    t = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(t, group=ctx.group)
    return {"rank": ctx.rank, "world": ctx.world_size, "sum": t * scale}
"""


def test_function_defined_in_a_cell_runs_on_four_ranks(ranks4):
    cell = {"__name__": "__main__"}  # what a notebook cell's namespace looks like
    exec(CELL, cell)
    out = ranks4.run(cell["cell_function"], 2.0)
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    assert all(o["world"] == 4 for o in out)
    for o in out:  # 1 + 2 + 3 + 4 = 10 on every rank, times the scale
        assert torch.equal(o["sum"], torch.full((3,), 20.0))


def test_the_same_ranks_serve_many_calls(ranks4):
    before = ranks4.pids()
    for i in range(3):
        assert ranks4.run(lambda ctx, i: ctx.rank + i, i) == [i, i + 1, i + 2, i + 3]
    assert ranks4.pids() == before


def raise_on_rank_2(ctx):
    import torch.distributed as dist

    if ctx.rank == 2:
        raise ValueError("deliberate failure on rank 2")
    dist.all_reduce(torch.ones(3), group=ctx.group)  # the others wait for rank 2 forever


def test_an_exception_on_one_rank_surfaces_its_traceback_and_the_ranks_recover(ranks4):
    old = ranks4.pids()
    t0 = time.perf_counter()
    with pytest.raises(RankError) as info:
        ranks4.run(raise_on_rank_2)
    elapsed = time.perf_counter() - t0
    assert info.value.rank == 2
    assert "ValueError: deliberate failure on rank 2" in str(info.value)
    assert "raise_on_rank_2" in info.value.remote_traceback  # the frame of the failing function
    assert 'raise ValueError("deliberate failure on rank 2")' in info.value.remote_traceback  # its source line
    assert "rank 0: waiting in all_reduce" in str(info.value)
    assert elapsed < ranks4.error_grace + 10.0  # seconds, not the process group's 30-minute timeout
    assert wait_gone(old) == []
    assert ranks4.run(lambda ctx: ctx.rank) == [0, 1, 2, 3]  # restarted cleanly


def hang_unless_rank_0(ctx):
    import torch.distributed as dist

    if ctx.rank == 0:
        time.sleep(60)
    else:
        dist.all_reduce(torch.ones(5), group=ctx.group)


def test_a_hang_ends_in_a_timeout_that_says_who_waits_where(ranks4):
    old = ranks4.pids()
    t0 = time.perf_counter()
    with pytest.raises(RankTimeout) as info:
        ranks4.run(hang_unless_rank_0, timeout=5.0)  # long enough for ranks 1-3 to reach the all-reduce
    assert time.perf_counter() - t0 < 5.0 + 10.0  # ends near the call's timeout, not the group's
    assert "not in a collective" in info.value.waiting[0]
    for r in (1, 2, 3):
        assert info.value.waiting[r].startswith("waiting in all_reduce (20 B")
    assert wait_gone(old) == []
    assert ranks4.run(lambda ctx: ctx.world_size) == [4] * 4


def test_a_rank_that_dies_is_reported(ranks2):
    old = ranks2.pids()
    with pytest.raises(RankError, match="rank 1 exited with code 3"):
        ranks2.run(lambda ctx: os._exit(3) if ctx.rank == 1 else time.sleep(30))
    assert wait_gone(old) == []


def test_interrupting_a_call_stops_every_rank(ranks2):
    old = ranks2.pids()
    threading.Timer(0.5, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        ranks2.run(lambda ctx: time.sleep(30))
    assert wait_gone(old) == []


def test_ranks_die_with_their_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""
        import os, signal, sys
        from playbook.cluster import Ranks
        r = Ranks(2, backend="gloo").start()
        print(*r.pids(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # like a kernel killed from the outside
    """)
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    assert wait_gone(pids) == []


def test_tensors_and_progress_come_back(ranks2, capsys):
    def work(ctx):
        for i in range(5):
            ctx.progress(i + 1, 5, "steps")
        print("from inside")
        return torch.arange(4) * ctx.rank

    out = ranks2.run(work)
    assert torch.equal(out[1], torch.tensor([0, 1, 2, 3]))
    captured = capsys.readouterr()
    assert "[rank 0] from inside" in captured.out
    assert "steps" in captured.err  # the terminal form of the progress bar


def test_fresh_launch_stops_its_ranks():
    seen = launch(lambda ctx: os.getpid(), 2)
    assert len(set(seen)) == 2
    assert wait_gone(seen) == []


@pytest.mark.parametrize(
    "world_size, backend, message",
    [
        (0, "gloo", "world_size must be a positive integer"),
        (-2, "gloo", "world_size must be a positive integer"),
        (10_000, "gloo", "try world_size in {1, 2, 4, 8"),
        (2, "mpi", "backend must be 'auto', 'gloo' or 'nccl'"),
    ],
)
def test_bad_world_sizes_are_refused_before_anything_starts(world_size, backend, message):
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("(", r"\(")):
        check_world_size(world_size, backend)
    with pytest.raises(ValueError):
        Ranks(world_size, backend=backend)


def test_a_four_axis_layout_fits_on_a_two_core_machine_and_past_the_cap_is_refused():
    """dp2×tp2×pp2×cp2 needs 16 ranks: the cap is at least 16 whatever the core count (each CPU rank
    is a process), and one rank past it is refused with the sizes that work."""
    limit = max_local_ranks()
    assert limit >= 16
    check_world_size(16, "gloo")
    with pytest.raises(ValueError, match=f"limit {limit}\\); try world_size in \\{{1, 2, 4, 8, 16"):
        check_world_size(limit + 1, "gloo")


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs NCCL asks for")
def test_nccl_without_enough_gpus_says_what_to_do():
    with pytest.raises(ValueError, match="backend='nccl' needs one GPU per rank.*use backend='gloo'"):
        Ranks(2, backend="nccl")


def test_the_same_function_runs_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent("""
        import torch, torch.distributed as dist
        from playbook.cluster import launch

        def total(ctx):
            t = torch.tensor([float(ctx.rank + 1)])
            dist.all_reduce(t, group=ctx.group)
            return (ctx.rank, ctx.world_size, t.item(), ctx.tracer.counts_by_op())

        out = launch(total)
        if dist.get_rank() == 0:
            print("RESULT", out)
        dist.destroy_process_group()
    """)
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT [(0, 2, 3.0, {'all_reduce': 1}), (1, 2, 3.0, {'all_reduce': 1})]" in out.stdout
