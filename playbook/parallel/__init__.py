"""Run: every strategy on real ranks, on one spine, each checked against the single process.

The spine (below the strategy folders; none of it imports a strategy):
- ``training.py``: the run settings (``TrainSetup``), the one training loop, the single-process reference.
- ``comm.py``: the traced collectives (Megatron's f/g, SP's pair, uneven all-to-all, flat sums).
- ``grads.py``: the gradient table (a parameter's class -> the mesh axes its gradient is summed over);
  ``tied.py``: a tied embedding's copies on the first and last stage.
- ``parity.py``: the one parity gate; ``report.py``: the report ``playbook run`` prints;
  ``registry.py``: ``playbook run STRATEGY``'s table; ``mixed.py``: bf16 with fp32 master weights;
  ``single.py``: ``playbook run single``; ``loader.py``: a real DataLoader per rank (workers, prefetch,
  its position as ``state_dict``), its wait on the timeline (chapter 10).

A folder per strategy: ``dp/``, ``zero/``, ``tp/``, ``pp/``, ``cp/``, ``ep/``; above them ``hybrid/``,
which composes them all, and ``step_time.py``, which times each strategy's step beside its prediction.
"""

from playbook.parallel.registry import get, names, register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainResult, TrainSetup, train

__all__ = ["RunReport", "TrainResult", "TrainSetup", "compare", "get", "names", "register", "train"]
