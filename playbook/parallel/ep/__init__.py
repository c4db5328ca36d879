"""Expert parallelism (chapter 6): the experts of every MoE layer split across ranks.

- ``layers.py``: the expert-parallel MoE layer over uneven all-to-all.
- ``model.py``: trains the layers, puts the ranks' pieces back together, predicts the all-to-all bytes.
- ``run.py``: ``playbook run ep`` and its report.
"""

from playbook.parallel.ep.model import merge, parity, predicted_alltoall_bytes, train_moe

__all__ = ["merge", "parity", "predicted_alltoall_bytes", "train_moe"]
