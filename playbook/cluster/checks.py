"""Run: the checks made before any rank starts (backend, world size, launcher options)."""

from __future__ import annotations

import math
import multiprocessing as mp
import os

from playbook.config import require_positive


def default_backend(world_size: int) -> str:
    """``nccl`` with one GPU per rank when there are enough GPUs, else ``gloo``."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def max_local_ranks() -> int:
    """How many ranks this machine runs well: 4 per CPU core, at least 16, so that a four-axis layout
    (dp2×tp2×pp2×cp2) runs on a laptop (on CPU, each rank is a process)."""
    return max(16, 4 * (os.cpu_count() or 1))


def check_world_size(world_size: int, backend: str) -> None:
    require_positive(world_size=world_size)
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ValueError(
                "backend='nccl' needs one GPU per rank and no GPU is visible; use backend='gloo' (CPU processes)"
            )
        if world_size > gpus:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: world_size={world_size} but {gpus} GPU(s) visible; "
                f"use backend='gloo', or world_size <= {gpus}, or torchrun across nodes"
            )
    elif backend != "gloo":
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    limit = max_local_ranks()
    if world_size > limit:
        good = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= limit]
        raise ValueError(
            f"world_size={world_size} is more ranks than this machine can run ({os.cpu_count()} CPU cores, "
            f"limit {limit}); try world_size in {{{', '.join(map(str, good))}}}, or torchrun across nodes"
        )


def _check_options(timeout, error_grace, threads_per_rank, start_method) -> None:
    """Refuse launcher options that cannot work, before any process starts or stops."""
    for name, value, low in (("timeout", timeout, "> 0"), ("error_grace", error_grace, ">= 0")):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        if not ok or (value <= 0 if low == "> 0" else value < 0):
            raise ValueError(
                f"{name} must be a number of seconds {low}, got {value!r}; e.g. {name}={60 if name == 'timeout' else 2}"
            )
    require_positive(threads_per_rank=threads_per_rank)
    if start_method not in mp.get_all_start_methods():
        raise ValueError(f"start_method must be one of {mp.get_all_start_methods()}, got {start_method!r}")
