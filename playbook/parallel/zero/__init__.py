"""ZeRO and FSDP (chapter 2): optimizer states, gradients and weights sharded over the data ranks.

- ``flat_unit.py``: ZeRO's unit, a module group's parameters as one flat padded buffer.
- ``zero.py``: the algorithm, stages 1-3 (reduce-scatter, all-gather, prefetch).
- ``pipeline.py``: ZeRO-2/3 inside a pipeline (reduce on the last micro-batch, weights gathered once a step).
- ``sharded.py``: a sharded run on the one training loop, measured as chapter 2 shows it.
- ``run.py``: ``playbook run zero``; ``fsdp2.py``: the native counterpart, ``fully_shard`` (``playbook run fsdp2``).
"""

from playbook.parallel.zero.run import on_rank
from playbook.parallel.zero.fsdp2 import on_rank as fsdp2_on_rank

__all__ = ["fsdp2_on_rank", "on_rank"]
