"""Parallelism Playbook: train and serve a small GPT across real processes, predicted and measured."""

from playbook.config import Hardware, ModelConfig

__version__ = "0.1.0"
__all__ = ["Hardware", "ModelConfig", "__version__"]
