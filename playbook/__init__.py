"""Parallelism Playbook: train and serve a small GPT across real processes, predicted and measured.

The handful of names a notebook starts from; everything else lives in the stage it belongs to
(``playbook.theory``, ``playbook.parallel``, ``playbook.measure``, ``playbook.viz``).
"""

from playbook.cluster import RankError, Ranks, RankTimeout, launch, ranks
from playbook.config import ModelConfig
from playbook.hardware import Hardware

__version__ = "0.1.0"
__all__ = ["Hardware", "ModelConfig", "RankError", "RankTimeout", "Ranks", "__version__", "launch", "ranks"]
