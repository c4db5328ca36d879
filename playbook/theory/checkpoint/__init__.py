"""Distributed checkpoints, predicted: the pieces of every tensor each rank holds, and the bytes
each writes under the one write-once rule. No torch.

- ``pieces.py``: ``holdings`` (a rank's rectangles of every parameter: TP shards, ZeRO flat slices,
  pipeline chunks, experts), ``rectangles``, ``units``, ``shapes``;
- ``writes.py``: ``writers`` (lowest rank writes each replica), ``bytes_per_rank``, ``save_seconds``,
  ``model_checkpoint_bytes`` (a whole checkpoint at scale).
"""

from playbook.theory.checkpoint.pieces import Param, Piece, holdings, rectangles, shapes, units
from playbook.theory.checkpoint.writes import (
    RNG_BYTES,
    bytes_per_rank,
    model_checkpoint_bytes,
    save_seconds,
    step_writers,
    writers,
)

__all__ = [
    "Param",
    "Piece",
    "RNG_BYTES",
    "bytes_per_rank",
    "holdings",
    "model_checkpoint_bytes",
    "rectangles",
    "save_seconds",
    "shapes",
    "step_writers",
    "units",
    "writers",
]
