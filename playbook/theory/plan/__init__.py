"""Planning a run at scale (chapter 8b): every layout of N GPUs costed, ranked, explained, shrunk.

- ``search.py``: the search space (``Layout``, ``Candidate``, ``Plan``); ``planner.py``: the search;
  ``best_first.py``: one structure's best variant, best first (and the exhaustive sort it is tested against);
  ``advice.py``: what would work when nothing fits; ``layout.py``: one given layout costed.
- ``cost.py``: a step's time (compute, exposed communication, bubble); ``dp.py``: the data axis;
  ``schedule.py``: schedules and their bubbles; ``stage_balance.py``: the busiest stage;
  ``precision.py``: FP8; ``axis_bytes.py``: bytes per axis; ``memory.py``: memory on the most loaded GPU.
- ``validation.py``: the planner calibrated on published runs, ``fitted.py``: the choices that fitted
  it, each beside its alternative; ``shrink.py``: a layout at laptop size;
  ``step_time.py``: a step on a calibrated machine; ``launch.py``: torchrun and Slurm text;
  ``placed.py``: the planner priced on a topology (``theory.topology``, chapters 8 and 8b).
"""

from playbook.theory.plan.axis_bytes import busiest, replay_bytes
from playbook.theory.plan.cost import OVERLAP_PRESETS
from playbook.theory.plan.fitted import alternatives
from playbook.theory.plan.launch import torchrun_command
from playbook.theory.plan.layout import cost_layout, parse_layout
from playbook.theory.plan.memory import memory_bytes
from playbook.theory.plan.placed import best_by_tp, cost_on, placement_of, plan_on, ranking
from playbook.theory.plan.planner import MEM_UTIL, plan
from playbook.theory.plan.schedule import PLAN_SCHEDULES, chunk_layers, layers_held
from playbook.theory.plan.shrink import first_shrinkable, shrink
from playbook.theory.plan.stage_balance import stage_imbalance
from playbook.theory.plan.validation import done_when, llama3_runs, megatron_runs, validate

__all__ = [
    "MEM_UTIL",
    "OVERLAP_PRESETS",
    "PLAN_SCHEDULES",
    "alternatives",
    "best_by_tp",
    "cost_on",
    "busiest",
    "chunk_layers",
    "cost_layout",
    "done_when",
    "first_shrinkable",
    "layers_held",
    "llama3_runs",
    "megatron_runs",
    "memory_bytes",
    "parse_layout",
    "placement_of",
    "plan",
    "plan_on",
    "ranking",
    "replay_bytes",
    "shrink",
    "stage_imbalance",
    "torchrun_command",
    "validate",
]
