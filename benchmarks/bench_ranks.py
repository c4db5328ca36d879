"""How fast are real ranks from a notebook? Our launcher against the alternatives, measured.

    python benchmarks/bench_ranks.py [--world-size 4] [--calls 20] [--ipyparallel] [--spawn]

Reports, for each launcher: the first start (processes up and one process group joined) and the
overhead of one call of a trivial function (one all-reduce of 4 bytes) after that, as median and
max over ``--calls`` calls. Target (issue 2): under 1 s per call on 4 ranks on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def trivial(ctx):
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.group)
    return t.item()


def bench_playbook(world_size: int, calls: int, start_method: str) -> dict:
    from playbook.cluster import Ranks

    t0 = time.perf_counter()
    ranks = Ranks(world_size, backend="gloo", start_method=start_method).start()
    first = time.perf_counter() - t0
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        assert ranks.run(trivial, progress=False) == [float(world_size)] * world_size
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    ranks.stop(grace=0.0)
    ranks.start()
    restart = time.perf_counter() - t
    ranks.stop()
    return {
        "first_start_s": first,
        "restart_s": restart,
        "call_median_s": statistics.median(times),
        "call_max_s": max(times),
    }


def bench_ipyparallel(world_size: int, calls: int) -> dict:
    """ipyparallel engines joined into one gloo group (what ``%%px`` would give)."""
    import ipyparallel as ipp

    t0 = time.perf_counter()
    cluster = ipp.Cluster(n=world_size, log_level=40)
    rc = cluster.start_and_connect_sync()
    view = rc[:]
    engines_up = time.perf_counter() - t0
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    view.scatter("rank", list(range(world_size)), flatten=True, block=True)

    def join(port, world_size):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)  # noqa: F821
        return dist.get_rank()

    view.apply_sync(join, port, world_size)
    first = time.perf_counter() - t0

    def call():
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    times = []
    for _ in range(calls):
        t = time.perf_counter()
        assert view.apply_sync(call) == [float(world_size)] * world_size
        times.append(time.perf_counter() - t)
    cluster.stop_cluster_sync()
    return {
        "engines_up_s": engines_up,
        "first_start_s": first,
        "call_median_s": statistics.median(times),
        "call_max_s": max(times),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument(
        "--ipyparallel", action="store_true", help="also measure ipyparallel engines (pip install ipyparallel)"
    )
    p.add_argument("--spawn", action="store_true", help="also measure plain spawn (the slow fallback)")
    a = p.parse_args()
    report = {"world_size": a.world_size, "playbook (forkserver)": bench_playbook(a.world_size, a.calls, "forkserver")}
    if a.spawn:
        report["playbook (spawn)"] = bench_playbook(a.world_size, a.calls, "spawn")
    if a.ipyparallel:
        report["ipyparallel"] = bench_ipyparallel(a.world_size, a.calls)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
