"""Predict: where the layers go, cutting a model's pieces (embedding, blocks, head) into contiguous
pipeline stages: evenly by count (``equal_partition``), or minimising the heaviest stage by measured
time or bytes per layer (``balanced_partition``).

Pure Python; no torch.
"""

from __future__ import annotations

import functools
from typing import Sequence


def balanced_partition(weights: Sequence[float], parts: int) -> list[tuple[int, int]]:
    """Cut ``weights`` (one per layer, in order) into ``parts`` contiguous non-empty ranges
    [start, end) minimising the heaviest part (dynamic programming, exact). Use measured time per
    layer for speed, or bytes per layer for memory."""
    n = len(weights)
    if parts < 1 or parts > n:
        raise ValueError(f"cannot cut {n} layers into {parts} non-empty stages; use 1 <= stages <= {n}")
    prefix = [0.0]
    for x in weights:
        prefix.append(prefix[-1] + float(x))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]  # best[k][j]: first j layers in k parts
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            for i in range(k - 1, j):
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j] - 1e-15:
                    best[k][j], cut[k][j] = cost, i
    ranges, j = [], n
    for k in range(parts, 0, -1):
        ranges.append((cut[k][j], j))
        j = cut[k][j]
    return ranges[::-1]


def equal_partition(n_layers: int, parts: int) -> list[tuple[int, int]]:
    """The naive cut: transformer blocks split as evenly as possible, the embedding (piece 0) added to
    the first stage and the head (piece n_layers + 1) to the last; ranges over the n_layers + 2 pieces.
    Remembered per (n_layers, parts): a planner asks for it once per pipeline rank, and building it
    each time made a pipeline of p ranks cost p² (a list of its own is returned)."""
    return list(_equal_partition(n_layers, parts))


@functools.lru_cache(maxsize=1024)
def _equal_partition(n_layers: int, parts: int) -> tuple[tuple[int, int], ...]:
    if parts > n_layers + 2:
        raise ValueError(
            f"{parts} stages but only {n_layers} layers plus embedding and head; use stages <= {n_layers + 2}"
        )
    if parts > n_layers:  # too few blocks: give embedding and head stages of their own where needed
        return tuple(balanced_partition([1.0] * (n_layers + 2), parts))
    base, extra = divmod(n_layers, parts)
    ranges, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0) + (1 if k == 0 else 0) + (1 if k == parts - 1 else 0)
        ranges.append((start, start + size))
        start += size
    return tuple(ranges)
