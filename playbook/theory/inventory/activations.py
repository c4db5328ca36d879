"""Activation memory of OUR GPT (``playbook/model/gpt.py``), counted exactly, op by op.

"Activations" here means every tensor autograd saves during the forward pass for use in the
backward pass, counted once per storage (a tensor saved by two ops is held once), parameters and
buffers excluded. ``playbook.measure.SavedActivations`` records the same thing from a real run, and
the tests check that the two agree to the byte.

Notation: b micro-batch, s sequence length, h hidden, a query heads, g key/value heads, d head
dim, f ffn_hidden, V vocabulary, L layers, B bytes per element of floating tensors (``dtype_bytes``).

One block, reading ``Block.forward`` top to bottom (elements; multiply by B unless noted):

    attention RMSNorm  (x.pow(2), x * inv_rms, (x * inv_rms) * weight)
      input x                      b·s·h    saved by pow and by the multiply with inv_rms
      inv_rms = rsqrt(...)         b·s      saved by rsqrt's backward and by the multiply
      x * inv_rms                  b·s·h    saved by the multiply with the norm weight
    attention
      norm output                  b·s·h    saved by q_proj, k_proj, v_proj (one tensor, three users)
      q after RoPE                 b·a·s·d  saved by q @ kᵀ (RoPE itself saves only cos/sin: buffers)
      k repeated to a heads        b·a·s·d  saved by q @ kᵀ (GQA's repeat is a copy: no saving here)
      causal mask                  s²       BYTES (bool), saved by masked_fill; one per block
      probabilities                b·a·s²   softmax output, saved by softmax backward and by probs @ v
      v repeated to a heads        b·a·s·d  saved by probs @ v
      attention output             b·s·a·d  [b, s, a·d], saved by o_proj
    MLP RMSNorm
      input x + attn(...)          b·s·h    the residual sum
      inv_rms                      b·s
      x * inv_rms                  b·s·h
    SwiGLU
      norm output                  b·s·h    saved by gate_proj and up_proj
      gate_proj output             b·s·f    saved by silu
      silu(gate)                   b·s·f    saved by the product with up
      up_proj output               b·s·f    saved by the product with silu(gate)
      silu(gate) * up              b·s·f    saved by down_proj

    block = B·(6·b·s·h + 2·b·s + 4·b·a·s·d + b·a·s² + 4·b·s·f) + s²   bytes

(The residual adds, the scaling by 1/sqrt(d), the reshapes and RoPE's rotate-half save nothing:
their backward needs no tensor. The block's output is saved by the next block's first norm, so it
is counted there.) With a·d = h and f ≈ 8h/3 this is about 20.7·b·s·h + b·a·s² elements, i.e.
b·s·h·(41.3 + 2·a·s/h) bytes in 16-bit: compare Korthikanti et al.'s sbh(34 + 5as/h) for a GPT-3 block
with dropout and GeLU
(``playbook.theory.inventory.korthikanti.activation_bytes_per_layer``).

Around the blocks (``model_activation_bytes``):

    tokens                         b·s      int64 (8 bytes), saved by the embedding's backward
    final RMSNorm                  3·b·s·h + b·s   its input (the last block's output), x * inv_rms, output
    log-probabilities              b·s·V    log_softmax output, saved by it and by nll_loss
    targets                        b·s      int64 (8 bytes), saved by nll_loss
    total_weight                   1        a 0-d tensor nll_loss keeps for the mean

The logits themselves are not saved (log_softmax saves its output). With tied embeddings nothing
changes: the weight is a parameter. Passing explicit RoPE ``positions`` to the model adds
4·s·d·B per block (cos and sin gathered for q and for k are then new tensors, not buffer views);
these counts assume the default positions.

Recomputation (``GPT(..., recompute=...)``, torch.utils.checkpoint; Chen et al. 2016,
Korthikanti et al. 2022 §5):
- "full": a block keeps only its input, b·s·h·B; the rest is recomputed in backward. (While one
  block is being recomputed its full set exists for a moment: add one ``block_activation_bytes`` of
  recompute="none" for the backward-time peak.)
- "selective": ``causal_attention`` is recomputed from its inputs. Dropped: the mask (s² bytes), the
  probabilities (b·a·s²), and the repeated k, v and the copy of q made for q @ kᵀ; kept instead:
  q (b·a·s·d), k and v at their g key/value heads (b·g·s·d each). So selective =
  none − b·a·s²·B − s² − 2·b·(a − g)·s·d·B; for plain multi-head attention (g = a) exactly
  "drop the s² terms".

Attention kernel (``attention=``, Dao et al. 2022, *FlashAttention*, arXiv:2205.14135, §3.1):
- "eager" (the default): our model's ``causal_attention`` as counted above, with the [s, s] mask and
  the b·a·s² probabilities. Every measured == predicted check in the chapters uses this.
- "flash": a fused kernel, as every production run uses (FlashAttention-2 reads GQA's k and v at
  their g heads, no repeat). Forward keeps q, k, v, its output and the softmax's log-sum-exp, fp32
  [b, a, s]; backward recomputes the scores block by block from them, so no [s, s] tensor is ever
  saved. Korthikanti et al. 2022 (§5) reach the same with "selective" recomputation of the
  attention core, and the count is exactly that one plus the statistics: flash =
  selective + 4·b·a·s bytes per block (the inventory tags the statistics "core"; the output, a view, is the o_proj input
  already counted). With recompute="selective" the kernel itself is rerun in backward, so its
  log-sum-exp is not kept either: flash + selective = selective; "full" is unchanged.
  For plain multi-head attention (g = a): eager − flash = b·a·s²·B + s² − 4·b·a·s.

dtype: every floating tensor above has ``dtype_bytes`` per element, as when the model is cast with
``model.gpt.to(torch.bfloat16)`` (softmax, log_softmax and the norm then also run in bf16). Under
``torch.autocast`` some ops (softmax, log_softmax, the loss) run and save in fp32 and linear
layers save bf16 copies of fp32 inputs; that case is not modelled here. Index tensors (tokens,
targets) stay int64 and the mask stays bool whatever ``dtype_bytes`` is. The CPU measurement in
the tests is fp32 (``dtype_bytes=4``).

Every count here is a view (``theory.inventory.inventory.view``) of the one inventory of a block's tensors,
``theory.inventory.inventory.ours_block``, at the shapes one process sees; tensor, context and expert
parallelism read the same inventory at their ranks' local shapes (``theory.hybrid.local_activations``).

Units: bytes (ints). Nothing here imports torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.theory.inventory.inventory import CORES, RECOMPUTE_MODES, local, ours_block, ours_ends, view
from playbook.theory.inventory.korthikanti import activation_bytes_per_layer
from playbook.theory.inventory.moe import moe_estimate

ATTENTION_KERNELS = CORES[:2]  # "eager" (our model's), "flash" (a fused kernel)


def _check(cfg: ModelConfig, seq_len: int, micro_batch: int, dtype_bytes: int, recompute: str) -> None:
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("dtype_bytes", dtype_bytes)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")


def check_attention(attention: str) -> None:
    """One line naming the choices when ``attention`` is not a kernel we count."""
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {', '.join(map(repr, ATTENTION_KERNELS))}; got {attention!r}")


def block_activation_breakdown(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 4,
    recompute: str = "none",
    moe: bool = False,
    attention: str = "eager",
) -> dict[str, int]:
    """Bytes saved for backward by one transformer block, term by term (see the module docstring).
    ``moe=True``: a mixture-of-experts block, whose MLP terms are an estimate (routing unknown;
    ``theory.hybrid.local_activations.block_bytes`` counts even routing exactly).
    ``attention="flash"``: a fused kernel's core (selective's terms plus the fp32 log-sum-exp)."""
    _check(cfg, seq_len, micro_batch, dtype_bytes, recompute)
    check_attention(attention)
    x = local(cfg, seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes)
    return view(ours_block(cfg, x, core=attention, moe=moe_estimate(cfg, x) if moe else None), recompute)


def block_activation_bytes(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 4,
    recompute: str = "none",
    moe: bool = False,
    attention: str = "eager",
) -> int:
    """Bytes autograd saves for one block of our GPT (module docstring): with recompute="none",
    B·(6bsh + 2bs + 4basd + bas² + 4bsf) + s²; with ``attention="flash"`` the selective count
    plus 4bas (the kernel's fp32 log-sum-exp)."""
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute)
    return sum(block_activation_breakdown(cfg, **sizes, moe=moe, attention=attention).values())


def model_activation_breakdown(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 4,
    recompute: str = "none",
    attention: str = "eager",
) -> dict[str, int]:
    """Bytes saved for backward by the whole model and its loss, by part: tokens, all blocks,
    final norm, log-probabilities, targets, nll_loss's total_weight. Mixture-of-experts layers use
    the estimate of ``theory.inventory.moe``; multi-head latent attention is counted as if it were GQA.
    ``attention`` changes the blocks only (module docstring)."""
    sizes = dict(
        seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute, attention=attention
    )
    dense = block_activation_bytes(cfg, **sizes)
    moe = block_activation_bytes(cfg, **sizes, moe=True) if cfg.is_moe else 0
    first, last = ours_ends(cfg, local(cfg, seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes))
    blocks = (cfg.n_layers - cfg.n_moe_layers) * dense + cfg.n_moe_layers * moe
    return first | {"blocks": blocks} | last


def model_activation_bytes(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 4,
    recompute: str = "none",
    attention: str = "eager",
) -> int:
    """Bytes autograd saves for one forward of the whole model with its loss (one micro-batch):
    16bs (int64 tokens and targets) + L·block + B·(3bsh + bs + bsV + 1)."""
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute)
    return sum(model_activation_breakdown(cfg, **sizes, attention=attention).values())


def korthikanti_vs_exact(
    cfg: ModelConfig, seq_lens: list[int], *, micro_batch: int = 1, dtype_bytes: int = 2
) -> list[dict[str, float]]:
    """Per layer, for each sequence length: Korthikanti et al. 2022 (arXiv:2205.05198, Table 2, no
    parallelism) for a GPT-3 block, sbh·(34 + 5as/h) = 34·s·b·h + 5·a·s²·b bytes with 16-bit
    activations and 1-byte dropout masks (``theory.inventory.korthikanti.activation_bytes_per_layer``), beside the
    exact count for our dropout-free Llama-style block (:func:`block_activation_bytes`), with and
    without selective recomputation. Bytes; rows of plain numbers for a table or a figure."""
    rows = []
    for s in seq_lens:
        sizes = dict(seq_len=s, micro_batch=micro_batch, dtype_bytes=dtype_bytes)
        paper = activation_bytes_per_layer(seq_len=s, micro_batch=micro_batch, hidden=cfg.hidden, heads=cfg.n_heads)
        ours = block_activation_bytes(cfg, **sizes)
        rows.append(
            {
                "seq_len": s,
                "korthikanti": float(paper),
                "ours": float(ours),
                "ours_selective": float(block_activation_bytes(cfg, **sizes, recompute="selective")),
                "ratio": ours / paper,
            }
        )
    return rows


def korthikanti_over_exact_limit(cfg: ModelConfig, *, micro_batch: int = 1, dtype_bytes: int = 2) -> float:
    """The long-sequence limit of Korthikanti et al.'s count over ours (:func:`korthikanti_vs_exact`):
    the ratio of their s² coefficients. Both counts are A·s + B·s² exactly, so B = (f(2s) − 2f(s))/(2s²)
    at any s. Theirs is 5·a·b (softmax output 2, dropout mask 1, dropout output 2 bytes per score);
    ours keeps the probabilities once (2·a·b) and one bool mask: 5a/(2a + 1) at b = 1, 160/65 for
    32 heads."""
    s = 4096

    def paper(n: int) -> float:
        return activation_bytes_per_layer(seq_len=n, micro_batch=micro_batch, hidden=cfg.hidden, heads=cfg.n_heads)

    def ours(n: int) -> float:
        return block_activation_bytes(cfg, seq_len=n, micro_batch=micro_batch, dtype_bytes=dtype_bytes)

    return (paper(2 * s) - 2 * paper(s)) / (ours(2 * s) - 2 * ours(s))
