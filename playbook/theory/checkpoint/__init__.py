"""Distributed checkpoints, predicted: the pieces of every tensor each rank holds, and the bytes
each writes under the one write-once rule. No torch.

- ``pieces.py``: ``holdings`` (a rank's rectangles of every parameter: TP shards, ZeRO flat slices,
  pipeline chunks, experts), ``rectangles``, ``units``, ``shapes``;
- ``writes.py``: ``writers`` (lowest rank writes each replica), ``bytes_per_rank``;
- ``reads.py``: ``read_bytes`` (per loading rank, the bytes it keeps and the stored chunks it reads), ``requests``.

A whole checkpoint at scale and its write time are ``theory.life.checkpoint``'s (``checkpoint_bytes``,
``save_seconds``), which ``playbook plan`` reports.
"""

from playbook.theory.checkpoint.pieces import Param, Piece, holdings, rectangles, shapes, units
from playbook.theory.checkpoint.reads import read_bytes, requests
from playbook.theory.checkpoint.writes import (
    RNG_BYTES,
    bytes_per_rank,
    step_writers,
    writers,
)

__all__ = [
    "Param",
    "Piece",
    "RNG_BYTES",
    "bytes_per_rank",
    "holdings",
    "read_bytes",
    "rectangles",
    "requests",
    "shapes",
    "step_writers",
    "units",
    "writers",
]
