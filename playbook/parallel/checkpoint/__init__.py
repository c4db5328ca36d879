"""Distributed checkpoints of every hybrid layout, with PyTorch DCP: save under one, load under another.

- ``dcp_io.py``: ``Chunks`` (a tensor as rectangles of the whole, DCP's write/read protocol),
  ``write``, ``write_async``, ``read`` (with ``CountingReader``: bytes read, measured per rank), ``written_bytes`` (measured per rank), ``metadata``;
- ``state.py``: ``RankState``, a hybrid rank's weights, AdamW moments and steps as pieces;
- ``session.py``: ``CheckpointPlan`` and ``Session`` (resume, save every K steps), ``resolve``, ``read_meta``;
- ``inspect.py``: ``inspect`` (tensors, global shapes, shards per rank, bytes), its ``table``;
- ``options.py``: ``run hybrid``'s --save/--save-every/--resume/--overwrite/--async-save, checked before ranks;
- ``native.py``: ``save``/``load`` of the native FSDP2 / DTensor TP run (DCP's ``get_state_dict`` /
  ``set_state_dict``), in our format: either side's checkpoint loads into the other;
- ``drill.py``: ``drill``, the failure drill under ``torchrun --max-restarts`` (detect, restart, reload, work lost).
(``parallel.hybrid.resume``: a run cut in two across layouts, merged for parity.)
"""

from playbook.parallel.checkpoint.session import CheckpointPlan, read_meta, resolve
from playbook.parallel.checkpoint.dcp_io import written_bytes
from playbook.parallel.checkpoint.inspect import inspect, table

__all__ = [
    "CheckpointPlan",
    "inspect",
    "read_meta",
    "resolve",
    "table",
    "written_bytes",
]  # chapter 10: inspect, save_then_resume
