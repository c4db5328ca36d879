"""The hybrid mesh (chapter 8): every axis at once, composed in one fixed order.

- ``parallelize.py``: ``parallelize`` (TP (+SP), CP, EP, recomputation) and ``train_hybrid``, the rank
  function; ``pipeline.py``: the one pipeline driver of every layout; ``zero.py``: ZeRO over dp×cp;
  ``moe.py``: every stage's aux loss, routing; ``recompute.py``: activation recomputation.
- ``run.py``: ``playbook run hybrid``; ``merge.py``: the one reassembly of whole tensors for parity;
  ``native.py``: FSDP2 + DTensor on the same mesh; ``replay.py``: a planner candidate shrunk and replayed;
  ``resume.py``: ``save_then_resume``, a run saved under one layout and continued under another.
- ``conditions.py``: a run under made conditions (chapter 10): a straggler's sleep, a DataLoader per rank.
"""

from playbook.parallel.hybrid.conditions import Conditions
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.hybrid.merge import comm_table, merge
from playbook.parallel.hybrid.replay import replay
from playbook.parallel.hybrid.resume import save_then_resume

__all__ = ["Conditions", "comm_table", "merge", "replay", "save_then_resume", "train_hybrid"]
