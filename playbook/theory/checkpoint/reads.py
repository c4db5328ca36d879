"""What each rank reads on load, predicted from the two layouts alone: the saved one's stored pieces
(``writes.writers``) and the loading one's requests. No torch.

A loading rank asks for pieces of every tensor: its moments where its optimizer steps them
(``pieces.holdings``), its weights the same way, except that under ZeRO-1 and 2 a rank keeps every
weight of its stage whole (its flat buffer) and asks for them whole. DCP's planner answers each
request with one read item per stored chunk it overlaps (``create_read_items_for_chunk_list``), and
the file-system reader then reads that stored chunk whole (a ``torch.load`` of its bytes) and
narrows it to the overlap. So two numbers per rank:

- ``asked``: the bytes the rank keeps, the overlaps, its own holdings' size whatever the saved layout;
- ``read``: the bytes of the stored chunks its read items name, each chunk counted once per item that
  names it; ``read`` ≥ ``asked``, equal when every stored chunk lies within one request. A stored
  chunk cut by a request boundary (a tp4 shard read by a tp2 rank is not; a dp2 ZeRO slice read by a
  tp2 rank is) is read whole for a part: read amplification, the price of a layout-free format whose
  reader loads chunks, not byte ranges (torchtitan, Liang et al. 2024, arXiv:2410.06511, §3.4).

Beside the pieces every rank reads the data position (16 bytes, stored once), one row of the
generator table (``RNG_BYTES``), one row of the loader table (``LOADER_BYTES``) and one AdamW step (4 bytes) per parameter it steps.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.checkpoint.pieces import Piece, holdings, units
from playbook.theory.checkpoint.writes import DATA_BYTES, FP32, LOADER_BYTES, MOMENTS, RNG_BYTES, _overlap, writers


def requests(
    cfg: ModelConfig, dims: ParallelDims, rank: int, *, zero: int = 0, schedule: str = "1f1b", v: int = 1
) -> tuple[list[Piece], list[Piece]]:
    """(weight pieces, moment pieces) ``rank`` of the loading layout asks for."""
    held = holdings(cfg, dims, rank, zero=zero, schedule=schedule, v=v)
    if zero in (1, 2):  # the whole local weights
        whole = [
            Piece(p.name, p.offset, p.local) for _, _, ps in units(cfg, dims, rank, schedule=schedule, v=v) for p in ps
        ]
        return whole, held
    return held, held


def stored(cfg: ModelConfig, dims: ParallelDims, *, zero: int = 0, schedule: str = "1f1b", v: int = 1) -> dict:
    """The saved layout's stored pieces by tensor name (every element once)."""
    held = [holdings(cfg, dims, r, zero=zero, schedule=schedule, v=v) for r in range(dims.world)]
    out: dict[str, list[Piece]] = {}
    for pieces in writers(held):
        for p in pieces:
            out.setdefault(p.name, []).append(p)
    return out


def _tally(wanted: list[Piece], chunks: dict) -> tuple[int, int, int]:
    """(elements asked, elements of the stored chunks read, read items) for ``wanted``."""
    asked = read = items = 0
    for p in wanted:
        for q in chunks[p.name]:
            n = _overlap(p, q)
            if n:
                asked, read, items = asked + n, read + q.numel, items + 1
    return asked, read, items


def read_bytes(cfg: ModelConfig, saved: dict, loading: dict) -> list[dict[str, int]]:
    """Per rank of the ``loading`` layout, reading a checkpoint of the ``saved`` one (each a dict of
    ``dims``, ``zero``, ``schedule``, ``v``): ``asked`` and ``read`` bytes (the module docstring) and
    the number of read ``items``, tensors and small state together."""
    chunks = stored(cfg, saved["dims"], zero=saved["zero"], schedule=saved["schedule"], v=saved["v"])
    dims, kw = loading["dims"], dict(zero=loading["zero"], schedule=loading["schedule"], v=loading["v"])
    out = []
    for rank in range(dims.world):
        weights, moments = requests(cfg, dims, rank, **kw)
        wa, wr, wi = _tally(weights, chunks)
        ma, mr, mi = _tally(moments, chunks)
        steps = len({p.name for p in moments})
        small = FP32 * steps + DATA_BYTES + RNG_BYTES + LOADER_BYTES
        out.append(
            {
                "asked": FP32 * (wa + MOMENTS * ma) + small,
                "read": FP32 * (wr + MOMENTS * mr) + small,
                "items": wi + MOMENTS * mi + steps + 3,
            }
        )
    return out
