"""Any layout at once (chapter 8): the layout value, its refusals, and its bytes and memory per rank.

- ``plan.py``: ``Plan``, a ``ParallelDims`` with the variant of each strategy, and its checks;
  ``composition.py``: the one table of layout refusals.
- ``hybrid.py``: bytes per rank per step on every mesh axis, memory per rank; ``zero.py``: ZeRO's flat
  units on a mesh; ``moe.py``: an MoE stage; ``recompute.py``: what recomputation sends again.
- ``local_activations.py``: a rank's pieces, held as the schedule holds them; ``stages.py``: layer by
  layer, every degree together at any scale; ``memory.py``: ``training_memory`` and
  ``inference_memory`` of any layout; ``psi.py``: the tables in units of Ψ.
"""

from playbook.theory.hybrid.plan import Plan
from playbook.theory.hybrid.hybrid import comm_per_axis, memory_per_rank
from playbook.theory.hybrid.memory import inference_memory, kv_cache_bytes_per_token, training_memory
from playbook.theory.hybrid.psi import bytes_per_parameter, zero_psi_rows
from playbook.theory.hybrid.stages import layout_stage_memory
from playbook.theory.hybrid.composition import refusal

__all__ = [
    "Plan",
    "bytes_per_parameter",
    "comm_per_axis",
    "inference_memory",
    "kv_cache_bytes_per_token",
    "layout_stage_memory",
    "memory_per_rank",
    "refusal",
    "training_memory",
    "zero_psi_rows",
]
