"""What a block keeps (layer 0 of ``theory``): the one inventory of saved tensors and the model state.

- ``inventory.py``: a block's saved tensors from one rank's local shapes, each tagged with the
  recompute modes that keep it; two kernel sets, ours and production (``RECOMPUTE_MODES``, ``CORES``).
- ``activations.py``: our GPT's activations, exact (a view of the inventory); ``prod_activations.py``:
  production kernels' (Megatron-LM / Transformer Engine); ``korthikanti.py``: the paper's Table 2;
  ``moe.py``: an MoE layer's saved tensors.
- ``model_state.py``: weights, gradients and Adam's state under ZeRO; byte units (GB, GiB).
"""

from playbook.theory.inventory.activations import (
    block_activation_breakdown,
    block_activation_bytes,
    korthikanti_over_exact_limit,
    korthikanti_vs_exact,
)
from playbook.theory.inventory.korthikanti import activation_bytes_per_layer
from playbook.theory.inventory.model_state import bytes_to_gb, bytes_to_gib, model_state_bytes
from playbook.theory.inventory.prod_activations import production_block_breakdown

__all__ = [
    "activation_bytes_per_layer",
    "block_activation_breakdown",
    "block_activation_bytes",
    "bytes_to_gb",
    "bytes_to_gib",
    "korthikanti_over_exact_limit",
    "korthikanti_vs_exact",
    "model_state_bytes",
    "production_block_breakdown",
]
