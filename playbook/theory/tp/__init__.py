"""Tensor and sequence parallelism, predicted (chapter 3).

- ``layout.py``: which degrees are valid, and the weights one rank holds.
- ``comm.py``: the collectives per layer and rank, and their time.
- ``tp.py``: weights, collectives and activations per rank together.
"""

from playbook.theory.tp.tp import tp_block_activation_breakdown, tp_model_activation_bytes
from playbook.theory.tp.layout import check_tp, matrix_shards, params_per_rank, valid_tp
from playbook.theory.tp.comm import layer_comm, layer_seconds, step_collectives

__all__ = [
    "check_tp",
    "layer_comm",
    "layer_seconds",
    "matrix_shards",
    "params_per_rank",
    "step_collectives",
    "tp_block_activation_breakdown",
    "tp_model_activation_bytes",
    "valid_tp",
]
