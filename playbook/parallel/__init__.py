"""Run: each strategy as one short file, and the shared pieces every chapter compares against.

- ``training.py``: the run settings, one training loop, and the single-process reference.
- ``report.py``: parity numbers and the report that ``playbook run`` prints.
- ``registry.py``: ``playbook run STRATEGY`` looks strategies up here; each chapter registers one.
"""

from playbook.parallel.registry import get, names, register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainResult, TrainSetup, train

__all__ = ["RunReport", "TrainResult", "TrainSetup", "compare", "get", "names", "register", "train"]
