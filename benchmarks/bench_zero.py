"""Our ZeRO-3 against PyTorch's FSDP2 on the same model and ranks: step time and peak memory, as ratios.

    python benchmarks/bench_zero.py                      # gpt-small, seq 128, global batch 16, 2 and 4 ranks
    python benchmarks/bench_zero.py --model gpt-tiny --seq-len 64 --world-sizes 2 --steps 5 --json

Step time: the median over the timed steps (after one warm-up step) of the slowest rank's step.
Peak memory per rank: the model state held when the step starts (params, gradients, optimizer states,
counted from the tensors) plus the most bytes the CPU allocator had handed out *above* that during
one step (activations, gathered units, gradients, temporaries), read from the PyTorch profiler's
memory events ("Total Allocated"; the profiler does not see frees of blocks allocated before it
started, and warns so, which can only make this peak a little high, for both runs alike). Both runs train from the same seed on the same batches; the loss
of the last step is printed beside them as a sanity check. On a shared 2-core machine times are
noisy (±30%): compare ratios from one invocation, and rerun.
"""

from __future__ import annotations

import argparse
import json
import statistics

from playbook.cluster import Ranks
from playbook.parallel.training import TrainSetup

# The rank functions below are shipped to the ranks by value (this file is not a package), so they
# import what they use themselves.


def _peak_allocated_above_start(run_step) -> int:
    """Run ``run_step()`` under the profiler; the highest allocator total during it minus the total before it."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_step()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = [e for e in json.load(open(f.name))["traceEvents"] if e.get("name") == "[memory]"]
    if not events:
        return 0
    events.sort(key=lambda e: e["ts"])
    start = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"]
    return max(e["args"]["Total Allocated"] for e in events) - start


def bench_rank(ctx, setup: TrainSetup, which: str, steps: int):
    """One rank: build ZeRO-3 (ours) or FSDP2, time ``steps`` steps, profile one more for memory."""
    import time

    import torch
    import torch.distributed as dist

    from playbook.measure.sharding import held_bytes
    from playbook.model.gpt import GPT
    from playbook.parallel.zero.fsdp2 import shard_model
    from playbook.parallel.zero.zero import Zero

    torch.manual_seed(0)
    model = GPT(setup.config(), seed=setup.seed).to(ctx.device)
    group = ctx.mesh.group("dp")
    if which == "fsdp2":
        model = shard_model(model, ctx.mesh.device_mesh(ctx.device.type)["dp"])
        optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr)
        zero_grad = lambda: optimizer.zero_grad(set_to_none=True)  # noqa: E731
        forward = lambda x, y: model(x, y)[1]  # noqa: E731
        finish, held = optimizer.step, lambda: held_bytes(model, optimizer)
    else:
        zero = Zero(model, stage=3, group=group, lr=setup.lr, prefetch=which == "zero3")
        zero_grad, forward, held = zero.zero_grad, zero.loss, zero.held

        def finish():
            zero.sync()
            zero.step()

    task, times, loss = setup.task(), [], None

    def step(i):
        nonlocal loss
        x, y = task.batch(i, setup.global_batch, setup.seq_len, ctx.rank, ctx.world_size, device=ctx.device)
        loss = forward(x, y)
        loss.backward()
        finish()

    for i in range(steps + 1):
        zero_grad()
        dist.barrier(group=group)
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
    zero_grad()
    state = held()
    extra = _peak_allocated_above_start(lambda: step(steps + 1))
    state_bytes = state["params"] + state["grads"] + state["optimizer"]
    return {
        "times": times[1:],
        "state_bytes": state_bytes,
        "peak_bytes": state_bytes + extra,
        "loss": float(loss.detach()),
    }


def run(setup: TrainSetup, world_sizes: list[int], steps: int) -> list[dict]:
    rows = []
    for n in world_sizes:
        with Ranks(n, backend="gloo", timeout=600) as ranks:
            out = {}
            for which in ("zero3", "zero3-no-prefetch", "fsdp2"):
                per_rank = ranks.run(bench_rank, setup, which, steps, progress=False)
                slowest = [max(r["times"][i] for r in per_rank) for i in range(steps)]
                out[which] = {
                    "step_s": statistics.median(slowest),
                    "peak_bytes": max(r["peak_bytes"] for r in per_rank),
                    "state_bytes": per_rank[0]["state_bytes"],
                    "loss": per_rank[0]["loss"],
                }
            z, f = out["zero3"], out["fsdp2"]
            rows.append(
                {
                    "world_size": n,
                    **{k: v for k, v in out.items()},
                    "step_time_ratio": z["step_s"] / f["step_s"],
                    "peak_memory_ratio": z["peak_bytes"] / f["peak_bytes"],
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-small")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    setup = TrainSetup(model=args.model, steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len)
    rows = run(setup, args.world_sizes, args.steps)
    if args.json:
        print(json.dumps({"setup": setup.as_dict(), "rows": rows}, indent=2))
        return
    print(
        f"{args.model}, seq {args.seq_len}, global batch {args.global_batch}, {args.steps} timed steps (median of the slowest rank)"
    )
    print(f"{'ranks':>5} {'run':<18} {'step (ms)':>10} {'peak/rank (MB)':>15} {'state (MB)':>11} {'last loss':>10}")
    for row in rows:
        for which in ("zero3", "zero3-no-prefetch", "fsdp2"):
            r = row[which]
            print(
                f"{row['world_size']:>5} {which:<18} {r['step_s'] * 1e3:>10.1f} {r['peak_bytes'] / 1e6:>15.2f} "
                f"{r['state_bytes'] / 1e6:>11.2f} {r['loss']:>10.4f}"
            )
        print(
            f"{'':>5} ZeRO-3 / FSDP2: step time {row['step_time_ratio']:.2f}×, peak memory {row['peak_memory_ratio']:.2f}×"
        )


if __name__ == "__main__":
    main()
