"""Costs every strategy shares (layer 0 of ``theory``): collectives, FLOPs and matmul speed. Pure, no torch.

- ``comm.py``: ring bytes per collective and α–β time; ``ring.py``: the ring all-reduce step by step;
  ``allreduce_algo.py``: one-shot, two-shot or ring by message size; ``alpha_beta.py``: α, β fitted to
  measured times.
- ``flops.py``: FLOPs per token and step, MFU; ``gemm_efficiency.py``: achieved matmul speed by shape.
- ``trades.py``: what each strategy sends per micro-batch, side by side.
"""

from playbook.theory.cost.flops import achieved_mfu, flops_per_token
from playbook.theory.cost.gemm_efficiency import compute_factor
from playbook.theory.cost.ring import ring_allreduce_cost, ring_allreduce_steps
from playbook.theory.cost.trades import STRATEGY_TRADES, p2p_vs_tp_bytes

__all__ = [
    "STRATEGY_TRADES",
    "achieved_mfu",
    "compute_factor",
    "flops_per_token",
    "p2p_vs_tp_bytes",
    "ring_allreduce_cost",
    "ring_allreduce_steps",
]
