"""The model every chapter trains, on one process: the ground truth the parallel versions are checked against.

- ``gpt.py``: the small GPT (Llama-style: RMSNorm, RoPE, GQA, SwiGLU; MoE layers optional), written to
  be split: ``embed``, ``blocks``, ``head`` and ``loss`` are separate calls; recomputation modes.
- ``attention.py``: grouped-query attention with a swappable ``core`` (CP rings swap it) and ``project`` (TP).
- ``mlp.py``: SwiGLU, shared by the blocks and the experts.
- ``moe.py``: the mixture-of-experts MLP (top-k routing, capacity, aux loss) with three overridable
  questions the expert-parallel layer answers; ``ROUTED``/``is_expert``: which parameters are routed experts.
"""

from playbook.model.gpt import GPT, build_moe, lm_loss, RECOMPUTE_MODES
from playbook.model.moe import MoEMLP, moe_layers, routing_stats, is_expert

__all__ = ["GPT", "MoEMLP", "RECOMPUTE_MODES", "build_moe", "is_expert", "lm_loss", "moe_layers", "routing_stats"]
