"""Bytes of a whole training checkpoint at scale, and the time to write it.

What a resumable training checkpoint holds per parameter (gradients are not saved: the next step
recomputes them), by the precision convention of ``theory.inventory.model_state`` (ZeRO, Rajbhandari
et al. 2019, §3.1):

- ``"mixed"``: the 16-bit weights (2 B), the fp32 master copy and Adam's two fp32 moments (4 + 4 + 4 B):
  **14 bytes per parameter**, the 16Ψ of mixed-precision Adam less the 2Ψ of gradients;
- ``"fp32"``: fp32 weights and the two moments, **12 bytes per parameter**;

plus Adam's step count, one 4-byte fp32 scalar per parameter tensor (``torch.optim.AdamW`` keeps a
``step`` tensor per parameter). The data position and RNG states are a few bytes per rank, left out.

Save time: every node writes its share at ``storage_bandwidth`` bytes/s (the hardware profile's
per-node figure, ``Hardware.storage_bandwidth``), the shares spread evenly over the nodes, as a
distributed checkpoint that writes each shard once (no gather to one rank; replicated tensors
written by one of their holders) aims for. So the time is bytes / (nodes · bandwidth); a storage
system whose aggregate is lower than that sum caps it (``aggregate_bandwidth``). Pure arithmetic.
"""

from __future__ import annotations

import math

from playbook.theory.inventory.model_state import model_state_bytes

PRECISIONS = ("mixed", "fp32")

STEP_BYTES = 4  # AdamW's step: a scalar fp32 tensor per parameter tensor, as theory.inventory.model_state counts it


def checkpoint_bytes_per_param(precision: str = "mixed") -> int:
    """Weights plus optimizer states per parameter: 14 (mixed), 12 (fp32); gradients are not saved."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}; got {precision!r}")
    state = model_state_bytes(1, precision=precision)
    return int(state.params + state.optimizer)


def checkpoint_bytes(num_params: float, *, precision: str = "mixed", n_tensors: int = 0) -> dict:
    """The checkpoint's bytes by part: {"weights", "optimizer", "step", "total"}."""
    if isinstance(num_params, bool) or not isinstance(num_params, (int, float)) or not num_params > 0:
        raise ValueError(f"num_params must be a positive number, got {num_params!r}")
    checkpoint_bytes_per_param(precision)  # validates
    state = model_state_bytes(num_params, precision=precision)  # unsharded: the whole model's
    parts = {"weights": state.params, "optimizer": state.optimizer, "step": STEP_BYTES * n_tensors}
    return {**parts, "total": sum(parts.values())}


def save_seconds(total_bytes: float, *, nodes: int, storage_bandwidth: float, aggregate_bandwidth: float = math.inf) -> float:
    """Seconds to write ``total_bytes`` from ``nodes`` nodes at ``storage_bandwidth`` bytes/s each,
    capped by the storage system's ``aggregate_bandwidth`` (bytes/s; default: no cap)."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
    if not (isinstance(storage_bandwidth, (int, float)) and storage_bandwidth > 0):
        raise ValueError(
            f"storage bandwidth must be a positive number of bytes/s per node, got {storage_bandwidth!r}; "
            "set storage_bandwidth in the hardware profile (e.g. 1e9)"
        )
    if not total_bytes >= 0:
        raise ValueError(f"total_bytes must be at least 0, got {total_bytes!r}")
    return total_bytes / min(nodes * storage_bandwidth, aggregate_bandwidth)
