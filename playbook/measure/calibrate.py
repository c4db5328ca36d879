"""Measure this machine: matmul FLOP/s over sizes, and collective times over message sizes on real ranks.

``calibrate(n)`` times every collective the chapters use (all-reduce, all-gather, reduce-scatter,
all-to-all, send/recv) on ``n`` real gloo ranks (``playbook.cluster.Ranks``) over a range of
buffer sizes, fits α and β per collective with ``playbook.theory.cost.alpha_beta`` (the ring counts of
``playbook.theory.cost.comm``), times square matmuls with ``playbook.measure.matmul`` at one thread (one
rank's share of this machine), and returns a hardware profile in the schema of
``data/hardware/*.json`` with the fits, the raw points, the load average and the date added.

Timing: every repetition starts after a barrier; each rank times its own call; a repetition's
time is the slowest rank's (a collective is done when the last rank is). The fitted point is the
fastest repetition after warm-up calls: α and β describe the link and gloo, and on a shared
machine every slower repetition adds time the OS gave to someone else (the median is kept beside
it, ``median_seconds``, to show how much). That scheduling is then the step-time table's business,
not hidden inside α.
"""

from __future__ import annotations

import datetime
import os
import platform
import time

from playbook.theory.cost.alpha_beta import fit_collective

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")
FULL = {
    "elements": [256, 1024, 4096, 16384, 65536, 262144, 1048576],
    "repeats": 11,
    "warmup": 2,
    "matmul": [64, 128, 256, 512],
}
QUICK = {"elements": [256, 4096, 65536, 1048576], "repeats": 5, "warmup": 1, "matmul": [64, 256]}


def _time_collectives(ctx, elements: list[int], repeats: int, warmup: int) -> dict:
    """Rank function: {op: {elements: [seconds per repetition]}} for fp32 buffers of each size.
    The buffer size S is the full (gathered / unscattered) size, as ``theory.cost.comm`` counts it."""
    import torch
    import torch.distributed as dist

    n, rank = ctx.world_size, ctx.rank
    out: dict = {op: {} for op in OPS}
    for e in elements:
        e = max(n, e - e % n)  # divisible by n for the scattered ops
        full = torch.randn(e)  # [e]: the S-byte buffer
        part = torch.empty(e // n)  # [e/n]: one rank's slice
        calls = {
            "all_reduce": lambda: dist.all_reduce(full),
            "all_gather": lambda: dist.all_gather_single(full, part),
            "reduce_scatter": lambda: dist.reduce_scatter_single(part, full),
            "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full),
            # pairs (0→1, 2→3, ...) send at the same time; an odd last rank idles
            "send": lambda: (
                (dist.send(full, rank + 1) if rank + 1 < n else None) if rank % 2 == 0 else dist.recv(full, rank - 1)
            ),
        }
        for op, call in calls.items():
            times = []
            for i in range(warmup + repeats):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            out[op][e] = times
    return out


def _slowest(per_rank: list[dict], op: str, e: int) -> tuple[float, float]:
    """(median, minimum) over repetitions of the slowest rank's time."""
    slowest = sorted(max(t) for t in zip(*(r[op][e] for r in per_rank)))
    return slowest[len(slowest) // 2], slowest[0]


def storage_write_rate(nbytes: int = 64 << 20, folder: str | None = None) -> float:
    """Bytes/s of writing ``nbytes`` to a file in ``folder`` (default: the temp folder) and ``fsync``-ing
    it, as a checkpoint save must before it counts (``parallel.checkpoint``): the ``storage_bandwidth``
    a save time at scale is priced with (``theory.life.checkpoint.save_seconds``). One file, one writer;
    the folder's file system is what is measured (a tmpfs /tmp measures memory, not a disk)."""
    import tempfile

    block = os.urandom(1 << 20)  # incompressible, written 1 MiB at a time
    fd, path = tempfile.mkstemp(dir=folder, prefix=".playbook-storage-")
    try:
        t0 = time.perf_counter()
        for _ in range(max(1, nbytes >> 20)):
            os.write(fd, block)
        os.fsync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return max(1, nbytes >> 20) * len(block) / seconds


def memory_bandwidth(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes/s of one large copy (read + write counted: 2 × size), one thread, median of repeats."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes // 4)  # [nbytes/4] fp32
        dst = torch.empty_like(src)
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        return 2 * nbytes / sorted(times[1:])[repeats // 2]
    finally:
        torch.set_num_threads(saved)


def matmul_rates(sizes: list[int], repeats: int = 5) -> list[dict]:
    """[{size, seconds, median_seconds, flops_per_s}] of a [size, size] @ [size, size] matmul at one
    thread; the rate is the fastest repetition's, as for the collectives (module docstring)."""
    from playbook.measure.matmul import matmul_throughput

    rows = []
    for s in sizes:
        (r,) = matmul_throughput(s, s, s, tps=(1,), repeats=repeats, threads=1)
        rows.append(
            {
                "size": s,
                "seconds": r["min_seconds"],
                "median_seconds": r["seconds"],
                "flops_per_s": 2 * s**3 / r["min_seconds"],
            }
        )
    return rows


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16e9


def calibrate(world_size: int = 2, *, quick: bool = False, ranks=None) -> dict:
    """Measure this machine on ``world_size`` gloo ranks and return a hardware profile (a dict).
    ``ranks``: a running ``playbook.cluster.Ranks`` to reuse (else a fresh set is started and stopped)."""
    from playbook.cluster import Ranks

    if world_size < 2:
        raise ValueError(f"calibration needs at least 2 ranks to time collectives, got --ranks {world_size}; try 2")
    plan = QUICK if quick else FULL
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    own = ranks is None
    ranks = ranks if ranks is not None else Ranks(world_size, backend="gloo").start()
    try:
        per_rank = ranks.run(_time_collectives, plan["elements"], plan["repeats"], plan["warmup"])
    finally:
        if own:
            ranks.stop()
    elements = sorted(per_rank[0]["all_reduce"])
    collectives = {}
    for op in OPS:
        n = 2 if op == "send" else world_size  # one send crosses one link, whatever the world size
        sizes = [4.0 * e for e in elements]  # fp32 bytes
        times = [_slowest(per_rank, op, e) for e in elements]
        seconds = [fastest for _, fastest in times]
        fit = fit_collective(op, n, sizes, seconds)
        collectives[op] = {
            **fit.as_dict(),
            "group_size": n,
            "points": [{"bytes": s, "seconds": m, "median_seconds": t} for s, (t, m) in zip(sizes, times)],
        }
    matmul = matmul_rates(plan["matmul"], repeats=plan["repeats"])
    best = max(r["flops_per_s"] for r in matmul)
    plateau = sorted(r["flops_per_s"] for r in matmul)[len(matmul) // 2]
    seconds = time.perf_counter() - t0
    ar = collectives["all_reduce"]
    return {
        "memory_bytes": _physical_memory(),
        "peak_bf16_flops": best,
        "memory_bandwidth": memory_bandwidth(16 << 20 if quick else 64 << 20),
        "intra_node_bandwidth": ar["bandwidth"],
        "inter_node_bandwidth": 125e6,
        "devices_per_node": world_size,
        "intra_node_latency": ar["alpha"],
        "inter_node_latency": 1e-4,
        "achievable_flops_fraction": plateau / best,
        "storage_bandwidth": storage_write_rate(16 << 20 if quick else 64 << 20),
        "storage_source": "Measured: one file written and fsync-ed in the temp folder (measure.calibrate.storage_write_rate).",
        "source": (
            f"Measured by `playbook calibrate --ranks {world_size}{' --quick' if quick else ''}` on "
            f"{platform.node() or 'this machine'} ({os.cpu_count()} CPUs): peak_bf16_flops is the best fp32 "
            "matmul rate at one thread (one rank's share; fp32, the dtype our CPU ranks train in), "
            "achievable_flops_fraction the median size's rate over it; intra-node bandwidth and latency "
            "are the all-reduce fit (1/β, α) on gloo ranks; memory_bandwidth one large copy. "
            "inter_node_* are not measured (one machine): 1 Gb/s Ethernet stand-ins as in cpu-laptop."
        ),
        "planning_source": "α–β per collective in `collectives`, fitted by least squares on relative residuals.",
        "collectives": collectives,
        "matmul": matmul,
        "host": platform.node(),  # where it was measured: a label reads it (viz.calibrate.measured_where)
        "cpus": os.cpu_count(),
        "ranks": world_size,
        "threads_per_rank": 1,
        "quick": quick,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "calibration_seconds": seconds,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
