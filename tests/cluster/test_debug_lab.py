"""The appendix's PyTorch-tool cases, run from the chapter's own cells on 4 real gloo ranks: the code
a reader runs is the code checked here (the cells are read from the notebook and executed)."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import torch

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "09_debugging.ipynb"


def _cells(*ids) -> dict:
    """The namespace the chapter's cells ``ids`` define (their functions), executed in order."""
    by_id = {c.get("id"): c.source for c in nbformat.read(CHAPTER, as_version=4).cells}
    ns = {"torch": torch, "time": time}
    for cid in ids:
        exec(compile(by_id[cid], f"{CHAPTER.name}:{cid}", "exec"), ns)  # noqa: S102 - our own notebook
    return ns


def test_detail_debug_turns_the_order_hang_into_an_immediate_error_naming_both_collectives(ranks4):
    ns = _cells("dbg-33")
    started = time.perf_counter()
    results = ranks4.run(ns["out_of_order_checked"], timeout=30)
    assert time.perf_counter() - started < 15  # not the hang of case 1: an error, at once
    for rank, (message, _) in enumerate(results):
        assert message.startswith("Detected mismatch between collectives on ranks"), message[:200]
        named = {int(r): op for r, op, _ in ns["fingerprints"](message)}
        assert named[0] == "ALLREDUCE" and named[rank if rank else 1] == "ALLGATHER", named
    assert ranks4.run(lambda ctx: ctx.rank) == [0, 1, 2, 3]  # the ranks are fine afterwards


def test_monitored_barrier_names_the_rank_that_never_arrived(ranks4):
    ns = _cells("dbg-33", "dbg-36")
    said = ranks4.run(ns["late_to_the_barrier"], 3, timeout=30)
    assert "Ranks 3 failed to pass monitoredBarrier" in said[0], said[0]
    assert all("rank 0" in s for s in said[1:3]), said


def test_the_tracer_finds_the_straggler_that_makes_the_others_wait(ranks4):
    ns = _cells("dbg-38")
    spans = ranks4.run(ns["slow_loader"], 1, delay=0.3, steps=3, timeout=30)
    assert ns["last_to_enter"](spans) == [1, 1, 1]
    for i in range(3):  # the others wait about the straggler's 0.3 s longer than it does, whatever the load
        waits = [spans[r][i][1] for r in range(4)]  # (a busy machine stretches every wait, the straggler's too)
        assert all(w - waits[1] > 0.15 for r, w in enumerate(waits) if r != 1), waits


def test_the_stack_dumps_name_the_collective_each_rank_waits_in_and_the_line_that_called_it(ranks4):
    ns = _cells("dbg-stacks")
    frames = ranks4.run(ns["out_of_order_stacks"], timeout=60)
    assert [f[0][0] for f in frames] == ["all_reduce", "all_gather", "all_gather", "all_gather"], frames
    assert all(f[-1][0] == "out_of_order_stacks" for f in frames), frames


def test_one_rank_s_inf_poisons_every_rank_after_the_all_reduce_and_only_the_check_before_names_it(ranks4):
    ns = _cells("dbg-nan")
    assert ranks4.run(ns["poisoned_all_reduce"], 2) == [(True, False), (True, False), (False, False), (True, False)]
