"""Checkpoints of the native run (PyTorch FSDP2 over dp, DTensor TP over tp), with DCP's own
state-dict API, in the same format as ours: a checkpoint either side saved, the other loads.

``torch.distributed.checkpoint.state_dict.get_state_dict`` gives the model's parameters as the
DTensors FSDP2 and ``parallelize_module`` made (``Shard(0)`` over dp on top of the TP placement) and
AdamW's state by fully qualified name; each is renamed to our keys (``model/<fqn>``,
``optim/exp_avg/<fqn>``, ``optim/exp_avg_sq/<fqn>``, ``optim/step/<fqn>``; ``checkpoint.state``),
whose names are the single process's, so the two formats are one. A DTensor describes its own
place in the whole (``__create_chunk_list__``), so DCP reshards between a DTensor's ``Shard(0)``
rows and our flat ZeRO slices' rectangles as between any two of ours; ``set_state_dict`` then puts
what was read into the model and the optimizer (Zhao et al. 2023, arXiv:2304.11277, §4 on FSDP2's
DTensor state dicts; torchtitan, Liang et al. 2024, arXiv:2410.06511, §3.4).

DCP deduplicates a DTensor's replicas itself (a norm replicated over tp, AdamW's step held by every
rank): unlike ours, the native save leaves which rank writes a replica to DCP's planner, so the bytes
each native rank writes are not predicted here. A native save writes each rank's generator row as
ours does (our loader of the same world restores it); the native load leaves its generator alone:
neither run draws at random after step 0 (no dropout).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from playbook.parallel.checkpoint import dcp_io
from playbook.parallel.checkpoint.dcp_io import Chunks
from playbook.parallel.checkpoint.session import LATEST, META, resolve
from playbook.parallel.checkpoint.state import MOMENTS
from playbook.theory.checkpoint.writes import RNG_BYTES


def _ours(model, optimizer) -> tuple[dict, dict, dict]:
    """(our keys -> the native tensors, the model state dict, the optimizer state dict)."""
    msd, osd = get_state_dict(model, optimizer)
    out = {f"model/{k}": v for k, v in msd.items()}
    for fqn, st in osd["state"].items():
        for m in MOMENTS:
            out[f"optim/{m}/{fqn}"] = st[m]
        out[f"optim/step/{fqn}"] = st["step"]
    return out, msd, osd


def save(model, optimizer, folder: str | Path, *, step: int, losses: list[float], setup, dims, rank: int, group=None):
    """Write ``<folder>/step-<step>`` from every rank (each its DTensors' local shards), its
    ``playbook.json`` and ``latest`` from rank 0; returns the seconds DCP took."""
    import torch.distributed as dist
    from dataclasses import asdict

    state, _, _ = _ours(model, optimizer)
    if rank == 0:
        state["data/position"] = Chunks((2,), [((0,), torch.tensor([step, step * setup.global_batch]))])
    rng = torch.get_rng_state()
    state["rng/cpu"] = Chunks((dims.world, RNG_BYTES), [((rank, 0), rng.view(1, RNG_BYTES))])
    row = torch.tensor([[step, -1, 0]], dtype=torch.int64)  # batches made inline: no DataLoader position
    state["data/loader"] = Chunks((dims.world, 3), [((rank, 0), row)])
    final = Path(folder) / f"step-{step}"
    t0 = time.perf_counter()
    dcp.save(state, storage_writer=FileSystemWriter(str(final)), planner=dcp_io._Save(), process_group=group)
    seconds = time.perf_counter() - t0
    if rank == 0:
        layout = {"dims": asdict(dims), "native": True}
        meta = {"model": setup.model, "world": dims.world, "layout": layout, "setup": setup.as_dict()}
        (final / META).write_text(json.dumps(meta | {"step": step, "losses": losses[:step]}, indent=1))
        (Path(folder) / LATEST).write_text(final.name)
    dist.barrier(group=group)
    return seconds


def load(model, optimizer, folder: str | Path, group=None) -> dict:
    """Read the checkpoint ``folder`` names into the native model and AdamW (any layout saved it, ours
    or native): {"start", "losses", "seconds", "bytes"} (``dcp_io.CountingReader``'s counts)."""
    path = resolve(folder)
    meta = json.loads((path / META).read_text())
    state, msd, osd = _ours(model, optimizer)  # AdamW's state made (zero moments) where it has none yet
    data = torch.zeros(2, dtype=torch.int64)
    state["data/position"] = Chunks((2,), [((0,), data)])
    seconds, counts = dcp_io.read(state, path, group)
    set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
    return {"start": int(data[0]), "losses": list(meta["losses"]), "seconds": seconds, "bytes": counts}
