"""Data parallelism (chapter 1): every rank holds the whole model and reduces gradients.

- ``ddp.py``: the algorithm: naive per-tensor all-reduce, bucketed all-reduce, PyTorch's DDP beside them.
- ``train.py``: one rank's training loop under a variant; ``scaling.py``: the same step on more ranks, timed.
- ``run.py``: ``playbook run dp`` on real ranks, and the report against one process.
"""

from playbook.parallel.dp.run import on_rank, parity
from playbook.parallel.dp.scaling import scaling_on_rank, scaling_table

__all__ = ["on_rank", "parity", "scaling_on_rank", "scaling_table"]
