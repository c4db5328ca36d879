"""Measure one training step of each chapter's strategy on real ranks, and put the calibrated
prediction (``playbook.theory.plan.step_time``) beside it.

Each case runs the strategy's own rank function (``playbook.parallel.registry``: every one is
``on_rank(ctx, setup, **options)``) on a ``playbook.cluster.Ranks`` set for ``warmup + steps``
AdamW steps; the one training loop wraps every step in a ``step N`` span, so a step's time is the
slowest rank's span, and the figure is the median over the steps after warm-up (step 0 also
measures memory by category: always warm-up).

The prediction takes each collective's **calls** per step from the run's trace (structure, not
time: how many calls the code issues) and its **bytes** from the strategy's registered ``predict``
(its theory, the bytes its report prints as predicted) where it has one (DP, ZeRO, TP, PP, CP; the
chapters' tests show those equal the traced bytes to the byte); EP's all-to-all bytes depend on the
routing, and the hybrid's prediction is per mesh axis, so for those two the traced bytes are used.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict

from playbook.hardware import Hardware
from playbook.parallel.registry import get
from playbook.theory.plan.step_time import Comm, family, predict_step

# label -> (strategy, options for its rank function, world sizes)
CASES = {
    "DP": ("dp", {"variant": "bucketed"}, (2, 4)),
    "ZeRO-1": ("zero", {"stage": 1}, (2, 4)),
    "ZeRO-2": ("zero", {"stage": 2}, (2, 4)),
    "ZeRO-3": ("zero", {"stage": 3}, (2, 4)),
    "TP": ("tp", {}, (2, 4)),
    "PP (1f1b)": ("pp", {"schedule": "1f1b", "m": 4}, (2, 4)),
    "CP (ring)": ("cp", {"variant": "ring"}, (2, 4)),
    "EP": ("ep", {}, (2, 4)),
    "hybrid dp2×tp2": ("hybrid", {"dp": 2, "tp": 2}, (4,)),
}
MARGIN = 0.25  # beyond this relative error the table says why


def predicted_bytes(name: str, setup, n: int, options: dict) -> dict[str, float] | None:
    """Bytes one rank sends per step by collective family: the strategy's ``predict`` (the report's
    ``comm["predicted"]``), or None where it has none before the run."""
    predict = get(name).predict
    if predict is None:
        return None
    out: dict[str, float] = defaultdict(float)
    for op, sent in predict(setup, world_size=n, **options).items():
        if " " not in op and family(op) is not None:  # not a report's extra row ("all_reduce calls")
            out[family(op)] += sent
    return dict(out)


def _moe_config(setup):
    from playbook.parallel.ep.run import moe_config

    return moe_config(setup, None, None)


def step_windows(spans: list[dict], warmup: int) -> dict[int, dict[int, tuple[float, float]]]:
    """step -> rank -> (start, end) of the ``step N`` spans after warm-up."""
    out: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for s in spans:
        if s["kind"] == "compute" and s["name"].startswith("step ") and s["end"] is not None:
            k = int(s["name"].split()[1])
            if k >= warmup:
                out[k][s["rank"]] = (s["start"], s["end"])
    return out


def traced_loads(spans: list[dict], windows: dict, rank: int = 0) -> tuple[dict, float]:
    """(family -> {calls, sent_bytes, group_size} per step, seconds per step with a collective in
    flight) of ``rank``; overlapping async collectives are counted once (the union of their spans)."""
    steps = len(windows)
    loads: dict[str, dict] = {}
    intervals = []
    for s in spans:
        if s["rank"] != rank or s["kind"] != "comm":
            continue
        inside = any(w[rank][0] <= s["start"] <= w[rank][1] for w in windows.values() if rank in w)
        op = family(s["name"])
        if not inside or op is None:
            continue
        row = loads.setdefault(op, {"calls": 0.0, "sent_bytes": 0.0, "group_size": s["group_size"]})
        row["calls"] += 1 / steps
        row["sent_bytes"] += s["sent_bytes"] / steps
        row["group_size"] = max(row["group_size"], s["group_size"])
        if s["end"] is not None:
            intervals.append((s["start"], s["end"]))
    busy, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > reach:
            busy += b - max(a, reach)
            reach = b
    return loads, busy / steps


def compute_alone(setup, n: int, warmup: int = 2) -> float:
    """Median step seconds of one process at one thread training 1/n of the global batch (the
    same FLOPs as one of n data-parallel ranks, no collectives): what compute costs here, measured."""
    import time
    from dataclasses import replace

    import torch

    from playbook.model.gpt import GPT
    from playbook.parallel.training import train

    alone = replace(setup, global_batch=max(1, setup.global_batch // n), steps=setup.steps + warmup)
    model = GPT(alone.config(), seed=alone.seed)
    times = []

    def timed(step, total):
        times.append(time.perf_counter())

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        train(alone, model=model, measure=False, progress=timed)
    finally:
        torch.set_num_threads(saved)
    edges = [start, *times]
    return statistics.median(b - a for a, b in list(zip(edges, edges[1:]))[warmup:])


def reason(n: int, predicted: dict, measured: float, alone: float) -> str:
    """Which left-out cost the numbers point at, read from measurements (never a fitted constant):
    more ranks than cores; a run faster than predicted (communication counted as exposed was hidden,
    or the load fell); else the run's excess over one rank alone beyond the fitted communication
    (gloo's per-call cost beyond α, ranks waiting for each other, Python between collectives)."""
    cores = os.cpu_count() or 1
    if n > cores:
        return f"OS scheduling: {n} ranks time-share {cores} cores"
    if predicted["total"] > measured:
        return "faster than predicted: some communication hid behind compute, or the load fell"
    return (
        f"gloo per call / waiting: {(measured - alone) * 1e3:.0f} ms over 1 rank alone "
        f"vs {predicted['comm'] * 1e3:.0f} ms fitted"
    )


def model_rate(setup, n: int, alone: float) -> float:
    """FLOP/s one process reached training 1/n of ``setup``'s batch alone in ``alone`` seconds
    (``compute_alone``): the compute rate the predictions use, measured once per world size."""
    from playbook.theory.cost.flops import step_flops

    return step_flops(setup.config(), tokens=setup.global_batch * setup.seq_len, seq_len=setup.seq_len) / n / alone


def measure_case(ranks, label: str, setup, hw: Hardware, warmup: int = 2, alone: float | None = None) -> dict:
    """Run one case on ``ranks`` and return its row: predicted pieces (compute at the rate one rank
    reached alone, when ``alone`` is given), measured, error, load."""
    from dataclasses import replace

    name, options, _ = CASES[label]
    n = ranks.world_size
    run = replace(setup, steps=setup.steps + warmup)
    load = os.getloadavg()[0]
    ranks.run(get(name).on_rank, run, progress=False, **options)  # every strategy: on_rank(ctx, setup, **options)
    spans = [s if isinstance(s, dict) else s.as_dict() for s in ranks.last_trace]
    windows = step_windows(spans, warmup)
    per_step = [max(e - s for s, e in w.values()) for w in windows.values()]
    measured = statistics.median(per_step)
    loads, busy = traced_loads(spans, windows)
    want = predicted_bytes(name, setup, n, options)
    comm = [
        Comm(op, v["group_size"], v["calls"], want.get(op, v["sent_bytes"]) if want else v["sent_bytes"])
        for op, v in loads.items()
    ]
    # what the compute and bubble terms need of the case: the model that ran (EP's is the preset as an MoE)
    # and the pipeline's depth and micro-batches
    cfg = _moe_config(setup) if name == "ep" else setup.config()
    pp, m = (n, options["m"]) if name == "pp" else (1, 1)
    rate = model_rate(setup, n, alone) if alone is not None else None  # FLOP/s of the dense model alone
    pred = predict_step(
        cfg,
        hw,
        global_batch=setup.global_batch,
        seq_len=setup.seq_len,
        world_size=n,
        comm=comm,
        pp=pp,
        microbatches=m,
        flops_per_s=rate,
    ).as_dict()
    error = (pred["total"] - measured) / measured
    return {
        "strategy": label,
        "ranks": n,
        "predicted_ms": pred["total"] * 1e3,
        "compute_ms": pred["compute"] * 1e3,
        "comm_ms": pred["comm"] * 1e3,
        "bubble_ms": pred["bubble"] * 1e3,
        "measured_ms": measured * 1e3,
        "fastest_ms": min(per_step) * 1e3,
        "measured_comm_ms": busy * 1e3,
        "error": error,
        "load": load,
        "bytes_from": "theory" if want else "trace",
        "traced_bytes": {op: v["sent_bytes"] for op, v in loads.items()},
        "predicted_bytes": want,
        "alone_ms": alone * 1e3 if alone is not None else None,
        "load_after": os.getloadavg()[0],
        "reason": reason(n, pred, measured, alone) if abs(error) > MARGIN and alone is not None else "",
    }


def step_time_table(hw: Hardware, setup, *, world_sizes=(2, 4), labels=None, warmup: int = 2) -> list[dict]:
    """Every case of :data:`CASES` (or ``labels``) at each world size, on one rank set per size."""
    from playbook.cluster import Ranks

    rows = []
    for n in world_sizes:
        wanted = [lab for lab in (labels or CASES) if n in CASES[lab][2]]
        if not wanted:
            continue
        alone = compute_alone(setup, n, warmup)
        with Ranks(n, backend="gloo", timeout=300) as ranks:
            for label in wanted:
                why = not_runnable(label, setup, n)
                if why:
                    rows.append({"strategy": label, "ranks": n, "skipped": why})
                    continue
                rows.append(measure_case(ranks, label, setup, hw, warmup, alone))
    return rows


def not_runnable(label: str, setup, n: int) -> str:
    """Why a case cannot run with this model and rank count (its strategy's own check), or ''."""
    name, options, _ = CASES[label]
    cfg = setup.config()
    try:
        if name == "tp" or (name == "hybrid" and options.get("tp", 1) > 1):
            from playbook.theory.tp.layout import check_tp

            check_tp(cfg, options.get("tp", n), seq_len=setup.seq_len)
        if name == "pp" and cfg.n_layers < n:
            return f"{cfg.n_layers} layers cannot fill {n} stages"
        setup.local_batch(n)
    except ValueError as e:
        return str(e).splitlines()[0]
    return ""
