"""``playbook plan``'s run-life lines: a layout's checkpoint, its save time, the cluster's MTBF, the
checkpoint interval by Young (1974) and Daly (2006), and the goodput left (``theory.life``).

Flags: ``--restart-s`` (detect, reschedule and reload after a failure; an assumption to replace with
your measured restart) and ``--failures-per-gpu-hour`` (default Llama 3's, Dubey et al. 2024 §3.3.4).
The checkpoint is the whole training state, weights and Adam's moments in mixed precision (14 B per
parameter, ``theory.life.checkpoint``), written by every node at the hardware profile's
``storage_bandwidth``; it is the same for every layout of the same GPUs, as a distributed checkpoint
writes each shard once whatever the split.
"""

from __future__ import annotations

import math

from playbook.cli.checks import BadInput
from playbook.theory.life import (
    LLAMA3_FAILURES_PER_GPU_HOUR,
    checkpoint_bytes,
    cluster_mtbf,
    daly_interval,
    goodput,
    save_seconds,
    young_interval,
)

DEFAULT_RESTART_S = 300.0  # an assumption: minutes to detect a failure, reschedule the job and reload


def add_arguments(p) -> None:
    p.add_argument(
        "--restart-s",
        type=float,
        default=DEFAULT_RESTART_S,
        help="seconds from a failure to training again (detect, restart, reload): an assumption, measure yours",
    )
    p.add_argument(
        "--failures-per-gpu-hour",
        type=float,
        default=LLAMA3_FAILURES_PER_GPU_HOUR,
        help="failure rate of one GPU and its share of the host (default: Llama 3's 419 interruptions in 54 days "
        "on 16,384 GPUs, Dubey et al. 2024 §3.3.4)",
    )


def check(args) -> None:
    """One line for a restart or a failure rate that is not a positive, finite number."""
    if not (math.isfinite(args.restart_s) and args.restart_s >= 0):
        raise BadInput(f"--restart-s must be a number of seconds at least 0, got {args.restart_s:g}; e.g. --restart-s 300")
    rate = args.failures_per_gpu_hour
    if not (math.isfinite(rate) and 0 < rate <= 1):
        raise BadInput(
            f"--failures-per-gpu-hour must be greater than 0 and at most 1, got {rate:g}; e.g. "
            f"--failures-per-gpu-hour {LLAMA3_FAILURES_PER_GPU_HOUR:.3g} (Llama 3's)"
        )


def run_life(cfg, hw, *, gpus: int, gpus_per_node: int | None, restart_s: float, failures_per_gpu_hour: float) -> dict:
    """The numbers ``plan`` prints and puts under ``"life"`` in its JSON (seconds, bytes)."""
    per_node = gpus_per_node or hw.devices_per_node
    nodes = math.ceil(gpus / per_node)
    ckpt = checkpoint_bytes(cfg.num_params(), n_tensors=cfg.num_param_tensors())
    save = save_seconds(ckpt["total"], nodes=nodes, storage_bandwidth=hw.storage_bandwidth)
    mtbf = cluster_mtbf(gpus, failures_per_gpu_hour)
    young, daly = young_interval(save, mtbf), daly_interval(save, mtbf)
    return {
        "checkpoint_bytes": ckpt["total"],
        "checkpoint_bytes_per_gpu": ckpt["total"] / gpus,
        "nodes": nodes,
        "storage_bandwidth_per_node": hw.storage_bandwidth,
        "save_s": save,
        "failures_per_gpu_hour": failures_per_gpu_hour,
        "mtbf_s": mtbf,
        "restart_s": restart_s,
        "young_s": young,
        "daly_s": daly,
        "goodput_young": goodput(young, save, mtbf, restart_s),
        "goodput_daly": goodput(daly, save, mtbf, restart_s),
    }


def life_lines(r: dict, step_s: float | None = None) -> list[str]:
    """Two lines: the checkpoint and its save, then the failures and the interval (in steps of
    ``step_s`` seconds too, when a layout's step is known)."""
    steps = f" ≈ every {r['daly_s'] / step_s:,.0f} steps of {step_s:.2f} s" if step_s else ""
    return [
        f"checkpoint: {_size(r['checkpoint_bytes'])} (bf16 weights, fp32 master and Adam moments), "
        f"{r['checkpoint_bytes_per_gpu'] / 1e9:.2f} GB per GPU; save {r['save_s']:.2f} s at "
        f"{r['storage_bandwidth_per_node'] / 1e9:.2f} GB/s per node × {r['nodes']} nodes",
        f"failures: MTBF {r['mtbf_s'] / 3600:.2f} h at {r['failures_per_gpu_hour']:.3g} per GPU-hour; checkpoint every "
        f"{r['young_s'] / 60:.2f} min (Young) / {r['daly_s'] / 60:.2f} min (Daly){steps}; goodput {r['goodput_daly']:.1%} "
        f"with a {r['restart_s']:g} s restart",
    ]


def _size(x: float) -> str:
    return f"{x / 1e12:.2f} TB" if x >= 1e12 else f"{x / 1e9:.1f} GB"


def life_for(cfg, hw, args, gpus_per_node: int | None = None) -> dict:
    """``run_life`` from ``plan``'s flags, refused in one line first (``check``)."""
    check(args)
    return run_life(
        cfg,
        hw,
        gpus=args.gpus,
        gpus_per_node=gpus_per_node or args.gpus_per_node,
        restart_s=args.restart_s,
        failures_per_gpu_hour=args.failures_per_gpu_hour,
    )
