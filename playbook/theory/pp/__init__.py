"""Pipeline parallelism, predicted (chapter 4): schedules as data, their timelines and what ranks hold.

- ``types.py``: ``Action`` and ``Schedule``; ``orders.py``: each rank's compute order per schedule;
  ``schedules.py``: schedules by name, checked and built with their messages, closed forms,
  ``chunks_per_rank``; ``v.py``: the V shapes (ZB-V, DualPipe-V); ``dual.py``: DualPipe.
- ``simulator.py``: play a schedule with costs: timeline, bubble, deadlock, held activations.
- ``layer_partition.py``: layers onto stages; ``pipeline.py``: what each stage holds;
  ``rank_params.py``: a rank's chunks and their parameters in a hybrid layout.
"""

from playbook.theory.pp.types import Action, Schedule
from playbook.theory.pp.schedules import SCHEDULES, V_SCHEDULES, chunks_per_rank, closed_form, make_schedule
from playbook.theory.pp.simulator import Costs, Deadlock, simulate
from playbook.theory.pp.layer_partition import balanced_partition, equal_partition
from playbook.theory.pp.pipeline import chunk_activation_bytes, chunk_w_bytes
from playbook.theory.pp.dual import dualpipe_memory, make_dualpipe, readme_bubble
from playbook.theory.pp.v import v_orders, v_pairs

__all__ = [
    "Action",
    "Costs",
    "Deadlock",
    "SCHEDULES",
    "Schedule",
    "V_SCHEDULES",
    "balanced_partition",
    "chunk_activation_bytes",
    "chunk_w_bytes",
    "chunks_per_rank",
    "closed_form",
    "dualpipe_memory",
    "equal_partition",
    "make_dualpipe",
    "make_schedule",
    "readme_bubble",
    "simulate",
    "v_orders",
    "v_pairs",
]
