"""Who writes what, and the bytes each rank writes: the one rule, from the pieces alone. No torch.

Replicas (the dp and cp ranks of a weight without ZeRO, the tp ranks of a norm, the two copies of a
tied embedding on the first and last pipeline stage) hold the same elements; a checkpoint stores
them once. The rule: ranks in increasing order, each writes every piece it holds that no lower
rank has written; a piece that a lower rank already wrote (a replica) is skipped. A piece that a
lower rank wrote only in part would leave a seam, and is refused (no layout here makes one: replicas
lay a flat unit out alike). So the lowest rank of every replica group writes: rank 0's dp replica,
tp rank 0's norms, the first stage's tied embedding.

Beside the pieces (each fp32: the weight and AdamW's two moments), a checkpoint holds AdamW's
step per parameter (one fp32 scalar, written by the lowest rank holding any piece of it), the data
position (an int64 pair, the next step and the sequences consumed, written by rank 0) and every
rank's CPU generator state (``RNG_BYTES``, its own row of a [world, RNG_BYTES] uint8 table) and its
data loader's position (``LOADER_BYTES``, its row of a [world, 3] int64 table, ``parallel.loader``).
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.checkpoint.pieces import Piece, holdings

FP32 = 4
MOMENTS = 2  # AdamW's exp_avg and exp_avg_sq (Loshchilov & Hutter 2019), beside every weight
RNG_BYTES = 5056  # torch.get_rng_state() on CPU: the Mersenne Twister's 624 words and its counters, serialized
DATA_BYTES = 2 * 8  # (next step, sequences consumed), int64
LOADER_BYTES = 3 * 8  # a rank's data loader: (next step, workers, prefetch), int64; workers −1: no DataLoader


def _overlap(a: Piece, b: Piece) -> int:
    n = 1
    for ao, asz, bo, bsz in zip(a.offsets, a.sizes, b.offsets, b.sizes):
        n *= max(0, min(ao + asz, bo + bsz) - max(ao, bo))
    return n


def writers(per_rank: list[list[Piece]]) -> list[list[Piece]]:
    """The pieces each rank writes, from the pieces each holds (``per_rank[r]``): the module's rule."""
    done: dict[str, list[Piece]] = {}
    out = []
    for rank, pieces in enumerate(per_rank):
        mine = []
        for p in pieces:
            written = sum(_overlap(p, q) for q in done.get(p.name, []))
            if written == 0:
                mine.append(p)
            elif written != p.numel:
                raise ValueError(
                    f"{p.name}: rank {rank}'s piece {p.offsets}+{p.sizes} is partly another rank's; no rule writes it once"
                )
        for p in mine:
            done.setdefault(p.name, []).append(p)
        out.append(mine)
    return out


def step_writers(per_rank: list[list[Piece]]) -> list[list[str]]:
    """The parameters whose AdamW step each rank writes: the lowest rank holding a piece of each."""
    seen: set[str] = set()
    out = []
    for pieces in per_rank:
        names = sorted({p.name for p in pieces} - seen)
        seen |= set(names)
        out.append(names)
    return out


def bytes_per_rank(
    cfg: ModelConfig, dims: ParallelDims, *, zero: int = 0, schedule: str = "1f1b", v: int = 1
) -> list[dict[str, int]]:
    """Per rank, the tensor bytes it writes by kind: ``weights``, ``moments`` (AdamW's two),
    ``steps``, ``rng``, ``data``, ``loader``, and the ``total``."""
    held = [holdings(cfg, dims, r, zero=zero, schedule=schedule, v=v) for r in range(dims.world)]
    out = []
    for rank, (pieces, steps) in enumerate(zip(writers(held), step_writers(held))):
        weights = FP32 * sum(p.numel for p in pieces)
        row = {"weights": weights, "moments": MOMENTS * weights, "steps": FP32 * len(steps), "rng": RNG_BYTES}
        row["data"] = DATA_BYTES if rank == 0 else 0
        row["loader"] = LOADER_BYTES
        out.append(row | {"total": sum(row.values())})
    return out
