"""Tensor and sequence parallelism (chapter 3): Megatron-LM's split of every block.

- ``layers.py``: column- and row-parallel linears, the vocab-parallel embedding and loss, ``shard``.
- ``model.py``: the GPT with its blocks split over tp (+SP); ``moe.py``: a mixture of experts under tp.
- ``run.py``: ``playbook run tp``; ``native.py``: DTensor's ``parallelize_module`` on the same model.
"""

from playbook.parallel.tp.layers import shard
from playbook.parallel.tp.native import tp_plan, train_dtensor
from playbook.parallel.tp.run import gather_result, run_tp, train_tp

__all__ = ["gather_result", "run_tp", "shard", "tp_plan", "train_dtensor", "train_tp"]
