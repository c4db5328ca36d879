"""Measured timelines in the Chrome trace event format (Perfetto, chrome://tracing): the format's
fields, one process per rank, every span of the run present, sends paired with their receives."""

import json
import time
from collections import Counter, defaultdict

import pytest
import torch
import torch.distributed as dist

from playbook.cli import main
from playbook.cluster.trace.chrome import COMM, COMPUTE, TORCH_TIDS, chrome_trace, write_chrome_trace

BATCH = "batch_isend_irecv"
REQUIRED = {"X": {"name", "ph", "pid", "tid", "ts", "dur"}, "M": {"name", "ph", "pid", "args"}}


def check_format(trace: dict, spans: list[dict]) -> dict:
    """Every check a viewer relies on; returns the complete events by rank."""
    json.dumps(trace)  # JSON as it stands
    events = [e for e in trace["traceEvents"] if e.get("tid", 0) < TORCH_TIDS]  # the profiler's: see below
    by_rank = defaultdict(list)
    for e in events:
        assert REQUIRED.get(e["ph"], {"ph", "pid", "ts"}) <= set(e), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0 and e["tid"] in (COMPUTE, COMM), e
            by_rank[e["pid"]].append(e)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in {s["rank"] for s in spans}}  # one process per rank
    for rank, xs in by_rank.items():  # times are monotonic per rank and thread
        for tid in (COMPUTE, COMM):
            ts = [e["ts"] for e in xs if e["tid"] == tid]
            assert ts == sorted(ts), (rank, tid)
    # every span of the run is one complete event, with its name, rank and thread
    assert Counter((e["pid"], e["name"]) for xs in by_rank.values() for e in xs) == Counter(
        (s["rank"], s["name"]) for s in spans
    )
    flows = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "f"):
            assert e["ph"] not in flows[e["id"]], e  # one start and one finish per arrow
            flows[e["id"]][e["ph"]] = e
    for arrow in flows.values():
        assert set(arrow) == {"s", "f"}, arrow
        start, finish = arrow["s"], arrow["f"]
        assert finish["bp"] == "e" and start["pid"] != finish["pid"]

        def inside(point, names):
            return any(
                x["tid"] == point["tid"] and x["name"] in names and x["ts"] <= point["ts"] <= x["ts"] + x["dur"]
                for x in by_rank[point["pid"]]
            )

        assert inside(start, {"send", "isend", BATCH}) and inside(finish, {"recv", "irecv", BATCH}), arrow
    return {"by_rank": by_rank, "flows": flows}


def test_a_synthetic_exchange_pairs_the_kth_send_with_the_kth_receive():
    spans = [
        {"rank": 0, "kind": "compute", "name": "step 0", "start": 1.0, "end": 2.0},
        {"rank": 0, "kind": "comm", "name": "isend", "start": 1.1, "end": 1.2, "peer": 1, "tag": 0, "bytes": 8},
        {"rank": 0, "kind": "comm", "name": "isend", "start": 1.3, "end": 1.4, "peer": 1, "tag": 0, "bytes": 8},
        {"rank": 1, "kind": "comm", "name": "irecv", "start": 1.15, "end": 1.25, "peer": 0, "tag": 0},
        {"rank": 1, "kind": "comm", "name": "irecv", "start": 1.35, "end": 1.45, "peer": 0, "tag": 0},
        {"rank": 1, "kind": "comm", "name": "all_reduce", "start": 1.5, "end": None, "waited": 1.6, "axis": "dp"},
    ]
    trace = chrome_trace(spans)
    got = check_format(trace, spans)
    assert len(got["flows"]) == 2
    first = got["flows"][0]
    assert first["s"]["ts"] == pytest.approx(150_000) and first["f"]["ts"] == pytest.approx(200_000)  # µs, midpoints
    reduce = next(e for e in got["by_rank"][1] if e["name"] == "all_reduce")
    assert reduce["dur"] == pytest.approx(100_000) and reduce["args"]["axis"] == "dp"
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "i"] == ["step 0"]  # the step boundary
    assert chrome_trace([])["traceEvents"] == []


def test_a_batch_of_sends_and_receives_gets_an_arrow_per_message():
    """A ring step (``batch_isend_irecv``: send to the next rank, receive from the previous) on 3
    ranks: 3 messages, each arrow from the sender's batch slice to the receiver's."""
    spans = [
        {"rank": r, "kind": "comm", "name": BATCH, "start": 1.0 + r / 10, "end": 1.5 + r / 10,
         "p2p": [["send", (r + 1) % 3, 0], ["recv", (r - 1) % 3, 0]]}
        for r in range(3)
    ]  # fmt: skip
    got = check_format(chrome_trace(spans), spans)
    pairs = {(f["s"]["pid"], f["f"]["pid"]) for f in got["flows"].values()}
    assert pairs == {(0, 1), (1, 2), (2, 0)}


def ring_steps(ctx):
    from playbook.parallel.comm import ring_pass

    t = torch.full((8,), float(ctx.rank))
    for _ in range(ctx.world_size):  # around the ring once: every rank's block comes back to it
        t, works = ring_pass(t, ctx.group)
        for w in works:
            w.wait()
    return t[0].item()


def test_ring_passes_on_ranks_are_traced_with_their_peers(ranks4, tmp_path):
    assert ranks4.run(ring_steps, progress=False) == [0.0, 1.0, 2.0, 3.0]
    trace = json.loads(ranks4.write_trace(tmp_path / "ring.json").read_text())
    got = check_format(trace, ranks4.last_trace)
    assert len(got["flows"]) == 4 * 4  # 4 steps, each rank sends once per step
    assert {(f["s"]["pid"], f["f"]["pid"]) for f in got["flows"].values()} == {(0, 1), (1, 2), (2, 3), (3, 0)}


def ping_pong(ctx, pad: float = 0.0):
    """Three messages from rank 0 to rank 1, each after a "compute" span around ``t * 2``, with ``pad``
    seconds of sleep either side of it (the profiled run: the profiler converts its own clock to
    wall-clock time, and on a loaded machine that conversion can be off by more than a tiny op lasts)."""
    t = torch.full((4,), float(ctx.rank))  # no aten::mul outside the compute spans
    for _ in range(3):
        with ctx.tracer.span("compute"):
            time.sleep(pad)
            t = t * 2
            time.sleep(pad)
        if ctx.rank == 0:
            dist.send(t, 1, tag=7)
        else:
            dist.recv(t, 0, tag=7)
    dist.all_reduce(t)
    return t.sum().item()


def test_ranks_write_their_last_call_as_a_trace(ranks2, tmp_path):
    ranks2.run(ping_pong, progress=False)
    path = ranks2.write_trace(tmp_path / "ping.json")
    trace = json.loads(path.read_text())
    got = check_format(trace, ranks2.last_trace)
    assert len(got["flows"]) == 3  # three messages, three arrows
    assert {f["s"]["name"] for f in got["flows"].values()} == {"message 0→1 tag 7"}


def ping_pong_profiled(ctx, path):
    """ping_pong with 30 ms of padding, torch.profiler recording rank 0's operators (its Chrome export written to path)."""
    from torch.profiler import ProfilerActivity, profile

    if ctx.rank != 0:
        return ping_pong(ctx, 0.03)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = ping_pong(ctx, 0.03)
    prof.export_chrome_trace(str(path))
    return result


def test_one_ranks_torch_profile_folds_in_on_the_same_clock(ranks2, tmp_path):
    """The profiler's operators land in rank 0's process, each inside the compute span that ran it
    (``t * 2`` is an aten::mul in the middle of a 60 ms "compute"): the two clocks agree to within 30 ms
    (without the shift between them they are 1e9 s apart)."""
    ranks2.run(ping_pong_profiled, tmp_path / "torch.json", progress=False)
    path = write_chrome_trace(tmp_path / "both.json", ranks2.last_trace, torch_profile=(0, tmp_path / "torch.json"))
    trace = json.loads(path.read_text())
    check_format(trace, ranks2.last_trace)  # our spans, as without the profile
    ops = [e for e in trace["traceEvents"] if e.get("tid", 0) >= TORCH_TIDS and e["ph"] == "X"]
    assert ops and {e["pid"] for e in ops} == {0}
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert all(names[e["tid"]].startswith("torch.profiler") for e in ops)
    for tid in {e["tid"] for e in ops}:
        ts = [e["ts"] for e in ops if e["tid"] == tid]
        assert ts == sorted(ts)
    compute = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 0 and e["name"] == "compute"]
    muls = [e for e in ops if e["name"] == "aten::mul"]  # t * 2, once in each compute span
    assert len(compute) == 3 and len(muls) == 3
    for c in compute:
        inside = [m for m in muls if c["ts"] <= m["ts"] and m["ts"] + m["dur"] <= c["ts"] + c["dur"]]
        middle = c["ts"] + c["dur"] / 2
        assert len(inside) == 1, (c["ts"], c["dur"], [(m["ts"] - middle) / 1e3 for m in muls])  # ms off centre


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "pp", "--world-size", "2", "--microbatches", "4", "--steps", "1", "--no-native"],
        ["run", "hybrid", "--dp", "2", "--pp", "2", "--steps", "1"],
    ],
    ids=["pp", "hybrid"],
)
def test_playbook_run_writes_a_timeline_with_one_row_per_rank(argv, tmp_path, capsys, monkeypatch):
    from playbook.cli import run as cli_run

    handed, write = [], cli_run.write_trace  # the launches' spans the command hands to write_trace
    monkeypatch.setattr(
        cli_run, "write_trace", lambda p, title, traces: (handed.append(traces), write(p, title, traces))
    )
    path = tmp_path / "run.json"
    assert main([*argv, "--trace", str(path)]) == 0
    assert f"written to {path}" in capsys.readouterr().err
    trace = json.loads(path.read_text())
    check_format(trace, handed[0][0])  # the spans the file was written from, every one present
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    world = 2 if argv[1] == "pp" else 4
    assert {e["pid"] for e in xs} == set(range(world))
    sends = [e for e in xs if e["name"] == "isend"]
    flows = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    assert sends and len(flows) == len(sends)  # every pipeline message has its arrow
    assert {e["args"]["axis"] for e in sends} == {"pp"}


def test_a_trace_path_that_cannot_be_written_is_refused_before_ranks_start(tmp_path, capsys):
    for bad in (tmp_path, tmp_path / "missing" / "run.json"):
        assert main(["run", "single", "--world-size", "1", "--trace", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("playbook: error: --trace")
