"""Our tensor parallelism against DTensor's: training step time on the same model and ranks.

    python benchmarks/bench_tp.py [--model gpt-small] [--tp 2 4] [--steps 10] [--global-batch 8]
                                  [--seq-len 128] [--matmul] [--json]

For each t and with/without sequence parallelism, on one persistent set of t gloo ranks: build
our ``TPGPT`` (sliced from the reference) and DTensor's ``parallelize_module`` version, run 2
warm-up steps, then time ``--steps`` AdamW steps (a barrier before and after; the slowest rank's
time). Also the single process (one thread, like a rank) as the baseline. ``--matmul`` adds the
local-matmul throughput sweep of the chapter (``parallel.tp.model.matmul_throughput``) at this model's
sizes. Timings on a shared CPU machine are noisy (±30%); run it twice.
"""

from __future__ import annotations

import argparse
import json
import time


def step_time(ctx, setup, kind: str, sequence_parallel: bool, steps: int) -> float:
    """Seconds per training step on this rank (``kind``: "ours" or "dtensor")."""
    import contextlib

    import torch
    import torch.distributed as dist

    from playbook.model.gpt import GPT
    from playbook.parallel.tp.model import TPGPT, sync_replicated_grads

    ref = GPT(setup.config(), seed=setup.seed).to(ctx.device)
    if kind == "ours":
        model = TPGPT(ref, ctx.group, sequence_parallel=sequence_parallel)
        context = contextlib.nullcontext
        after = (lambda m: sync_replicated_grads(m, ctx.group)) if sequence_parallel else None
    else:
        from torch.distributed.tensor.parallel import loss_parallel

        from playbook.parallel.tp.native import dtensor_gpt

        model = dtensor_gpt(ref, ctx.group, ctx.device.type, sequence_parallel=sequence_parallel)
        context, after = loss_parallel, None
    opt = torch.optim.AdamW(model.parameters(), lr=setup.lr)
    task = setup.task()
    times = []
    for step in range(2 + steps):
        tokens, targets = task.batch(step, setup.global_batch, setup.seq_len, device=ctx.device)
        dist.barrier(group=ctx.group)
        t0 = time.perf_counter()
        with context():
            opt.zero_grad(set_to_none=True)
            _, loss = model(tokens, targets)
            loss.backward()
            if after:
                after(model)
            opt.step()
        dist.barrier(group=ctx.group)
        times.append(time.perf_counter() - t0)
    return sum(times[2:]) / steps


def single_step_time(setup, steps: int) -> float:
    import torch

    from playbook.model.gpt import GPT

    torch.set_num_threads(1)
    model = GPT(setup.config(), seed=setup.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=setup.lr)
    task = setup.task()
    times = []
    for step in range(2 + steps):
        tokens, targets = task.batch(step, setup.global_batch, setup.seq_len)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(tokens, targets)[1].backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return sum(times[2:]) / steps


def main() -> None:
    from playbook.cluster import Ranks
    from playbook.parallel.training import TrainSetup

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--matmul", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    setup = TrainSetup(model=args.model, steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len)
    rows = [{"tp": 1, "sp": False, "kind": "single process", "seconds": single_step_time(setup, args.steps)}]
    for t in args.tp:
        with Ranks(t, backend="gloo", timeout=600) as ranks:
            for sp in (False, True):
                for kind in ("ours", "dtensor"):
                    per_rank = ranks.run(step_time, setup, kind, sp, args.steps, progress=False)
                    rows.append({"tp": t, "sp": sp, "kind": kind, "seconds": max(per_rank)})
    out = {"setup": setup.as_dict(), "step_times": rows}
    if args.matmul:
        from playbook.measure.matmul import matmul_throughput

        cfg = setup.config()
        out["matmul"] = matmul_throughput(
            args.global_batch * args.seq_len, cfg.hidden, cfg.ffn_hidden, tuple(2**k for k in range(9)), repeats=10
        )
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"{args.model}, global batch {args.global_batch} × seq {args.seq_len}, mean of {args.steps} steps (gloo, CPU)"
    )
    print(f"{'t':>3} {'SP':>5} {'implementation':<16} {'ms/step':>9}")
    for r in rows:
        print(f"{r['tp']:>3} {str(r['sp']):>5} {r['kind']:<16} {r['seconds'] * 1e3:>9.1f}")
    for r in out.get("matmul", []):
        print(f"matmul t={r['tp']:>3} {r['shape']}: {r['flops_per_s'] / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
