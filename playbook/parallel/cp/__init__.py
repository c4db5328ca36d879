"""Context parallelism (chapter 5): every sequence split across ranks.

- ``ring_attention.py``: ring (zig-zag causal balance), all-gather and Ulysses attention over a split sequence.
- ``model.py``: the GPT's pieces under CP (the attention core, the loss share, RoPE at global positions).
- ``run.py``: training on real ranks and ``playbook run cp``; ``work.py``: the ring's work per rank, measured.
"""

from playbook.parallel.cp.ring_attention import attention, ring_attention
from playbook.parallel.cp.run import on_rank, predicted_memory, train_cp
from playbook.parallel.cp.work import ring_work_on_rank

__all__ = ["attention", "on_rank", "predicted_memory", "ring_attention", "ring_work_on_rank", "train_cp"]
