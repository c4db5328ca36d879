"""What a serving engine's profiling run finds before it sizes the KV cache (pure arithmetic, no torch).

vLLM loads the weights, then runs one forward of dummy inputs over its largest step
(``max_num_batched_tokens`` tokens) and reads the allocator's peak; the cache then gets what is left
of ``gpu_memory_utilization`` × the device's total memory (vLLM, ``Worker.determine_available_memory``
and ``profile_run`` in ``vllm/v1/worker/gpu_worker.py`` and ``gpu_model_runner.py``):

    KV cache = util × total − weights − activation peak − non-torch memory (CUDA graphs, NCCL, context)

so the activations live inside the 0.9, and the other 10 % is headroom for other processes and the
allocator's fragmentation. ``activation_peak`` is the middle term predicted from the model's shapes;
the non-torch memory is measured by the engine, not modelled here.

The peak of an inference forward (nothing is kept for a backward) is the set of tensors one layer holds
at once over the ``tokens`` rows of the step, each rank's share under tensor parallelism:

- the residual stream and its normalised copy, ``2·T·hidden``;
- attention: the fused q/k/v projection ``T·(H + 2·G)·Q/tp``, the attention output ``T·H·Q/tp`` and
  the projection back ``T·hidden`` (a fused kernel such as FlashAttention never holds the T×T scores;
  MLA: its query, latent and expanded key/value widths instead);
- the MLP (SwiGLU): gate and up ``T·2·F/tp``, their product ``T·F/tp`` and the down projection
  ``T·hidden``, F the widest MLP a token passes (a MoE token's top-k and shared experts together,
  counted as if every routed row stayed on this GPU, an upper bound under expert parallelism).

The peak is the larger of the two sub-blocks. Not counted: the head's logits, which an engine computes
only for the rows it samples (one per sequence, far fewer than T; vLLM's profile also runs its sampler
over ``max_num_seqs`` dummy rows), the attention kernel's workspace and any compiler's buffers: this is
a lower bound of what the profiling run measures, not a fit to it.

Units: bytes.
"""

from __future__ import annotations

from playbook.config import ModelConfig, require_positive
from playbook.theory.inventory.model_state import _dtype_bytes


def _attention_width(cfg: ModelConfig, tp: int) -> float:
    """Per-token values one rank's attention holds besides the residual stream: projections in, output."""
    if cfg.attention == "mla":  # query, the shared latent + rope key, the expanded keys/values, the output
        q = cfg.n_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) / tp
        kv = cfg.n_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim) / tp
        return q + cfg.kv_lora_rank + cfg.qk_rope_head_dim + kv + cfg.n_heads * cfg.v_head_dim / tp
    kv_heads = max(cfg.kv_heads / tp, 1)  # tp > kv_heads: a KV head is replicated, each rank computes one
    return (cfg.n_heads / tp + 2 * kv_heads) * cfg.dim_head + cfg.n_heads / tp * cfg.dim_head


def _mlp_width(cfg: ModelConfig) -> int:
    """The widest MLP a token passes: the dense one, or a MoE layer's top-k and shared experts."""
    moe = (cfg.top_k + cfg.n_shared_experts) * cfg.expert_ffn_hidden if cfg.n_experts else 0
    dense = cfg.ffn_hidden if (not cfg.n_experts or cfg.n_dense_layers) else 0
    return max(moe, dense)


def activation_peak(cfg: ModelConfig, *, tokens: int, tp: int = 1, dtype: str = "bf16") -> float:
    """Bytes one GPU of a ``tp``-way replica holds at the peak of one forward over ``tokens`` rows:
    the residual stream and its normalised copy, plus the larger of attention's and the MLP's
    intermediates (module docstring). vLLM's profiling run measures this peak over
    ``max_num_batched_tokens`` and subtracts it before the KV cache gets the rest."""
    require_positive(tokens=tokens, tp=tp)
    f = _mlp_width(cfg)
    attention = _attention_width(cfg, tp) + cfg.hidden
    mlp = 3 * f / tp + cfg.hidden  # gate and up, their product, the down projection's output
    return tokens * (2 * cfg.hidden + max(attention, mlp)) * _dtype_bytes(dtype)
