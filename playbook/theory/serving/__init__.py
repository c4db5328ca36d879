"""Serving, predicted (chapter 7): memory, the prefill/decode roofline, layouts, caches and traces.

- ``serving.py``: KV bytes and capacity, prefill and decode time; ``profile.py``: the activation peak
  an engine's profiling run finds before it sizes the cache; ``layouts.py``: TP against DP
  replicas on N GPUs; ``parallel.py``: pipeline and expert parallelism at inference;
  ``moe_layouts.py``: a MoE's TP attention against DP attention, the experts over every GPU.
- ``prefix_cache.py``: the brute-force prefix cache the engine is tested against, hit rates per
  layout; ``router.py``: round robin or prefix-aware; ``workload.py``: seeded traces;
  ``disagg.py``: when disaggregating prefill from decode pays; ``on_topology.py``: the layouts on a
  topology's levels (chapter 8).
- ``weights.py``: the weights one TP rank holds to the byte, quantized linears with their scales;
  ``quantized.py``: what 8-bit weights and KV cache do to capacity and decode at scale.
- ``speculative.py``: speculative decoding's tokens per verify and speed-up, where it stops paying
  as the batch grows, and the chi-square check of a sampler.
"""

from playbook.theory.serving.serving import kv_capacity
from playbook.theory.serving.disagg import transfer
from playbook.theory.serving.moe_layouts import compare_moe_layouts, recommend_moe
from playbook.theory.serving.on_topology import serve_layouts_on
from playbook.theory.serving.prefix_cache import prefix_layouts
from playbook.theory.serving.speculative import batch_curves, chi_square, chi_square_threshold
from playbook.theory.serving.workload import conversations, poisson_trace
from playbook.theory.serving.weights import served_weight_bytes

__all__ = [
    "batch_curves",
    "chi_square",
    "chi_square_threshold",
    "compare_moe_layouts",
    "conversations",
    "kv_capacity",
    "poisson_trace",
    "prefix_layouts",
    "recommend_moe",
    "serve_layouts_on",
    "served_weight_bytes",
    "transfer",
]
