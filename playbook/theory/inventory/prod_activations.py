"""Activations of a PRODUCTION training stack (Megatron-LM / Transformer Engine kernels), by tensor:
the planner's default, beside ``theory.inventory.activations`` (OUR teaching GPT's kernels, exact to the byte).

Per layer, on one rank of tp = t (sequence parallelism whenever t > 1), cp = c, s' = s/c tokens,
b sequences, B bytes per activation element (16-bit: 2), a query and g key/value heads of d:

    norm before attention   input, sharded s'/t under SP           s'·b·h·B/t
      (fused RMSNorm)       its fp32 1/rms statistics               4·s'·b/t
    q, k, v input           the norm output; under SP Megatron saves its SHARD and all-gathers it
                            again in backward (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2)
                                                                    s'·b·h·B/t
    flash attention         q, k, v (after RoPE) and its output (the o_proj input, one tensor)
                            s'·b·(2a + 2g)·d·B/t, and its fp32 log-sum-exp 4·s'·b·a/t
                            (Dao et al. 2022, arXiv:2205.14135; no [s, s] tensor is kept)
    norm before the MLP     input (the residual sum), statistics, output shard as above
    fused SwiGLU            fc1's output [gate | up], saved by the fused kernel, 2·s'·b·f·B/t, and
                            its output, the down-projection's input, s'·b·f·B/t
    no dropout              (Llama 3, DeepSeek-V3 and Megatron's current GPT recipes train without)

Switches reproduce Korthikanti et al. 2022 Table 2 (GPT-3 block: LayerNorm, GeLU MLP with
f = 4h, eager attention, dropout with 1-byte masks): ``attention="eager"`` keeps Q, K (4sbh), V
(2sbh), the softmax output (2as²b), ``dropout=True`` adds its mask (as²b) and output (2as²b) and
the two sbh dropout masks after attention and the MLP; ``mlp="gelu"`` keeps the GeLU's input and
output (8sbh each); ``norm="layernorm"`` keeps only the input (their count). Then a layer is
34·s·b·h + 5·a·s²·b bytes, sbh(10 + 24/t + 5as/(ht)) under TP, sbh(34/t + 5as/(ht)) with SP,
minus the s² term under selective recomputation (``tests/theory/test_prod_activations.py``).

Recomputation: "selective" reruns the attention core (flash: the kernel, so its log-sum-exp is
not kept; eager: the s² tensors); "full" keeps only each layer's input, s'·b·h·B/t (with SP the
input is already the shard; the paper's table writes 2sbh for every t). The tensors are the
production kernel set of the one inventory (``theory.inventory.inventory.production_block``), viewed as
``theory.inventory.activations``' exact counts are (``theory.inventory.inventory.view``). No torch.
"""

from __future__ import annotations


from playbook.config import ModelConfig
from playbook.theory.inventory.inventory import INDEX_BYTES, production_block, view

ACTIVATION_MODELS = ("production", "ours")


def check_activations(activations: str) -> None:
    """One line naming the choices when ``activations`` is not a model we count."""
    if activations not in ACTIVATION_MODELS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATION_MODELS)}; got {activations!r}")


def production_block_breakdown(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool | None = None,
    recompute: str = "none",
    dtype_bytes: int = 2,
    attention: str = "flash",
    mlp: str = "swiglu",
    norm: str = "rmsnorm",
    dropout: bool = False,
    moe: bool = False,
) -> dict[str, float]:
    """Bytes one layer saves for backward on one rank, by tensor (module docstring). ``moe``: the
    MLP is a routed mixture of experts at even routing (each rank's experts see top_k/1 of the tokens
    on average): router probabilities, the dispatched tokens and the fused SwiGLU of every routed
    and shared expert copy."""
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be one of none, selective, full; got {recompute!r}")
    kernels = dict(attention=attention, mlp=mlp, norm=norm, dropout=dropout, moe=moe)
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    return view(production_block(cfg, **sizes, dtype_bytes=dtype_bytes, **kernels), recompute)


def production_block_bytes(cfg: ModelConfig, **kw) -> float:
    """Sum of :func:`production_block_breakdown`."""
    return sum(production_block_breakdown(cfg, **kw).values())


def production_end_bytes(
    cfg: ModelConfig, *, seq_len: int, micro_batch: int, tp: int = 1, cp: int = 1, dtype_bytes: int = 2
) -> tuple[float, float]:
    """(first stage's extra: the int64 token ids; last stage's extra: the final norm's input and
    output shard, the vocab-parallel cross-entropy's softmax [s', b, V/t] and the int64 labels)."""
    s, b, h, B, t = seq_len // cp, micro_batch, cfg.hidden, dtype_bytes, tp
    first = s * b * INDEX_BYTES
    last = 2 * s * b * h * B / t + s * b * cfg.vocab_size * B / t + s * b * INDEX_BYTES
    return float(first), float(last)
