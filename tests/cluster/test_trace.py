"""The collective tracer on real ranks: every op recorded once, with bytes derived by hand."""

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(
    not hasattr(dist, "all_gather_single"), reason="torch < 2.13 names these ops differently"
)


def issue_one_of_each(ctx):
    n, r, g = ctx.world_size, ctx.rank, ctx.group
    x = torch.ones(1000)  # 4000 bytes
    dist.all_reduce(x, group=g)
    full = torch.empty(1000 * n)
    dist.all_gather_single(full, x, group=g)
    out = torch.empty(250)
    dist.reduce_scatter_single(out, torch.ones(250 * n), group=g)
    dist.all_to_all_single(torch.empty(8 * n), torch.ones(8 * n), group=g)
    dist.broadcast(torch.ones(10), src=0, group=g)
    peer = (r + 1) % n
    ops = [dist.P2POp(dist.isend, torch.ones(16), peer), dist.P2POp(dist.irecv, torch.empty(16), (r - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    work = dist.all_reduce(torch.ones(2), group=g, async_op=True)
    with ctx.tracer.span("compute"):
        torch.ones(10).sum()
    work.wait()
    return ctx.tracer.spans


def test_every_collective_is_recorded_once_with_its_bytes(ranks4):
    n = 4
    spans = ranks4.run(issue_one_of_each)
    for rank_spans in spans:
        comm = {}
        for s in rank_spans:
            if s.kind == "comm":
                comm.setdefault(s.name, []).append(s)
        assert [s.name for s in rank_spans if s.kind == "comm"] == [
            "all_reduce",
            "all_gather_single",
            "reduce_scatter_single",
            "all_to_all_single",
            "broadcast",
            "batch_isend_irecv",
            "all_reduce",
        ]
        big, small = comm["all_reduce"]
        assert (big.bytes, big.sent_bytes) == (4000, 2 * 4000 * 3 / 4)  # ring all-reduce: 2S(n-1)/n
        assert (small.bytes, small.sent_bytes) == (8, 2 * 8 * 3 / 4)
        ag = comm["all_gather_single"][0]
        assert (ag.bytes, ag.sent_bytes) == (4000 * n, 4000 * n * 3 / 4)  # S is the gathered size
        rs = comm["reduce_scatter_single"][0]
        assert (rs.bytes, rs.sent_bytes) == (1000 * n, 1000 * n * 3 / 4)  # S is the unscattered input
        a2a = comm["all_to_all_single"][0]
        assert (a2a.bytes, a2a.sent_bytes) == (32 * n, 32 * 3)  # keeps its own 32 bytes
        assert comm["broadcast"][0].sent_bytes == 40
        p2p = comm["batch_isend_irecv"][0]
        assert (p2p.bytes, p2p.sent_bytes) == (128, 64)  # 64 bytes out, 64 in
        assert all(s.group_size == n and s.end >= s.start for s in rank_spans if s.kind == "comm")
        assert small.waited >= next(s for s in rank_spans if s.name == "compute").end  # waited on after it
    assert len(ranks4.last_trace) == sum(len(s) for s in spans)


def test_subgroups_are_named(ranks4):
    def pairs(ctx):
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mine = groups[ctx.rank // 2]
        dist.all_reduce(torch.ones(4), group=mine)
        return [(s.group, s.group_size, s.sent_bytes) for s in ctx.tracer.comm()]

    out = ranks4.run(pairs)
    assert out[0] == [("ranks0-1", 2, 16.0)]  # 2 * 16 * (2-1)/2
    assert out[3] == [("ranks2-3", 2, 16.0)]


def test_collectives_on_other_threads_are_recorded_too(ranks2):
    """On CUDA autograd runs backward on a device thread: its collectives must still be traced."""

    def from_a_thread(ctx):
        import threading

        t = threading.Thread(target=lambda: dist.all_reduce(torch.ones(3), group=ctx.group))
        t.start()
        t.join()
        return ctx.tracer.counts_by_op()

    assert ranks2.run(from_a_thread) == [{"all_reduce": 1}] * 2


def test_async_spans_record_completion_and_wait_separately(ranks2):
    def late_wait(ctx):
        import time

        work = dist.all_reduce(torch.ones(4), group=ctx.group, async_op=True)
        time.sleep(0.3)  # the all-reduce of 16 bytes completes long before we ask
        work.wait()
        return ctx.tracer.comm()[0]

    for span in ranks2.run(late_wait):
        assert span.start <= span.end <= span.waited
        assert span.waited - span.start >= 0.3
        assert span.end - span.start < 0.3  # completion was stamped when it happened, not at wait()
