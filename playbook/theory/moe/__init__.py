"""Mixtures of experts, predicted (chapter 6): capacity, routing, all-to-all bytes.

- ``capacity.py``: settings, expert capacity and what a routing drops; ``routing.py``: the capacity
  buffer's padded slots and the all-to-all across nodes; ``comm.py``: all-to-all bytes from counts.
- ``moe.py``: parameters and model state per rank under ep, bytes per step.
"""

from playbook.theory.moe.moe import step_comm_bytes, simulate_routing
from playbook.theory.moe.routing import capacity_buffer, cross_node_rows, ep_over_tp_bytes, node_limited_rows_sampled

__all__ = [
    "capacity_buffer",
    "cross_node_rows",
    "ep_over_tp_bytes",
    "node_limited_rows_sampled",
    "simulate_routing",
    "step_comm_bytes",
]
