"""One inventory of what a transformer block saves for backward on one rank, from the shapes that
rank sees; every activation count in ``theory/`` is a view of it.

A rank of any layout sees one block as local shapes (:class:`Local`, :func:`local`): b sequences of
s = seq/cp tokens inside the parallel regions, sn tokens outside them (s/tp under sequence
parallelism), a/tp query and g/tp key/value heads of d, f/tp MLP channels, B bytes per element.
The block is a list of :class:`Tensor` s, each tagged with when it is kept (Korthikanti et al. 2022,
arXiv:2205.05198, §4-5; Chen et al. 2016, arXiv:1604.06174, for full recomputation):

    "always"  kept without recomputation and under selective recomputation
    "core"    the attention core's own tensors: kept only without recomputation
    "rerun"   the core's inputs a checkpoint keeps instead (q, k, v): kept only under "selective"
    "input"   the block's input: the only tensor kept under "full"

:func:`view` turns the list into {name: bytes} for a recomputation mode. Two kernel sets build it:

- :func:`ours_block`: OUR GPT's kernels (``playbook/model/gpt.py`` and its parallel versions), measured to
  the byte in the tests: RMSNorm (input, 1/rms, x/rms, output); an eager, flash (Dao et al. 2022,
  arXiv:2205.14135) or context-parallel core (``theory.cp``); SwiGLU's four tensors or an MoE's (``theory.inventory.moe``).
- :func:`production_block`: Megatron-LM / Transformer Engine kernels (``theory.inventory.prod_activations``),
  with switches for Korthikanti et al.'s GPT-3 block (LayerNorm, GeLU, dropout).

Pure arithmetic, no torch, no import of another ``theory`` module: the lowest layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from playbook.config import ModelConfig, divisors

RECOMPUTE_MODES = ("none", "selective", "full")
CORES = ("eager", "flash", "ring", "allgather", "ulysses")
INDEX_BYTES = 8  # int64 token ids and targets
MASK_BYTES = 1  # torch.bool
LSE_BYTES = 4  # softmax statistics (log-sum-exp, 1/rms) are fp32 whatever the activations' dtype
KEPT = {"none": ("always", "core"), "selective": ("always", "rerun"), "full": ("input",)}


@dataclass(frozen=True)
class Tensor:
    """One tensor autograd keeps: its name, its bytes, and when it is kept (module docstring)."""

    name: str
    bytes: int | float
    keep: str = "always"


@dataclass(frozen=True)
class Local:
    """One block of one micro-batch as one rank sees it (module docstring); ``s_in``: the tokens of
    a saved region input (s, or sn when the sequence shard is saved and all-gathered again)."""

    b: int
    s: int
    sn: int
    s_in: int
    h: int
    a: int
    g: int
    d: int
    f: int
    B: int
    seq: int  # the whole sequence (context parallelism's cores see all of it)
    cp: int = 1


def local(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    regather: bool = False,
    dtype_bytes: int = 4,
) -> Local:
    """The local shapes of one block on a rank of tp × cp: s/cp tokens (s/(cp·tp) outside the regions
    under SP), a/tp and g/tp heads, f/tp channels (Shoeybi et al. 2019, arXiv:1909.08053, §3)."""
    s = seq_len // cp
    sn = s // tp if sequence_parallel else s
    a, g = cfg.n_heads // tp, cfg.kv_heads // tp
    return Local(micro_batch, s, sn, sn if regather else s, cfg.hidden, a, g, cfg.dim_head, cfg.ffn_hidden // tp,
                 dtype_bytes, seq_len, cp)  # fmt: skip


def view(tensors: list[Tensor], recompute: str = "none") -> dict[str, int | float]:
    """{name: bytes} of the tensors kept under ``recompute`` ("none", "selective", "full")."""
    if recompute not in KEPT:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    return {t.name: t.bytes for t in tensors if t.keep in KEPT[recompute]}


def check_ulysses(n: int, heads: int, kv_heads: int) -> None:
    """Ulysses gives each rank heads/n query heads and kv_heads/n key/value heads: n must divide both."""
    if heads % n or kv_heads % n:
        good = [m for m in divisors(heads) if kv_heads % m == 0]
        raise ValueError(
            f"ulysses splits attention heads over the ranks: cp={n} must divide n_heads={heads} and "
            f"n_kv_heads={kv_heads}; try cp in {{{', '.join(map(str, good))}}}, or variant='ring'"
        )


# ---- our kernels -------------------------------------------------------------------------------
def _norm(x: Local, part: str, first: str, last: str) -> list[Tensor]:
    """Our RMSNorm (x.pow(2), x * inv_rms, · weight) on sn tokens; its output is the region's input."""
    b, sn, h, B = x.b, x.sn, x.h, x.B
    return [
        Tensor(f"{part} norm: {first}", b * sn * h * B),
        Tensor(f"{part} norm: inv_rms", b * sn * B),
        Tensor(f"{part} norm: x * inv_rms", b * sn * h * B),
        Tensor(f"{part} norm: {last}", b * x.s_in * h * B),
    ]


def _core(x: Local, core: str, causal: bool) -> list[Tensor]:
    """The attention core's tensors (module docstring), with the inputs a checkpoint keeps instead."""
    b, s, a, g, d, B, S = x.b, x.s, x.a, x.g, x.d, x.B, x.seq
    qkv = [(b * a * s * d * B, "q (kept for recomputation)"), (b * g * s * d * B, "k (kept, kv heads)")]
    qkv.append((b * g * s * d * B, "v (kept, kv heads)"))
    if core == "flash":  # keeps q, k, v itself (g heads: no repeat) and the fp32 log-sum-exp
        lse = Tensor("log-sum-exp (fp32, flash kernel)", b * a * s * LSE_BYTES, "core")
        return [Tensor(name, n) for n, name in qkv] + [lse]
    rerun = [Tensor(name, n, "rerun") for n, name in qkv]
    if core == "eager":
        out = [("q (for q·kᵀ)", b * a * s * d * B), ("k repeated to all heads", b * a * s * d * B)]
        out += [("causal mask (bool)", s * s * MASK_BYTES), ("attention probabilities", b * a * s * s * B)]
        out += [("v repeated to all heads", b * a * s * d * B)]
        return [Tensor(n, v, "core") for n, v in out] + rerun
    rope = Tensor("RoPE cos, sin at this shard's positions (q and k)", 4 * s * d * B)  # explicit positions
    if core == "ring":
        out = [("q (after RoPE)", b * a * s * d * B), ("k (after RoPE), own shard", b * g * s * d * B)]
        out += [("v, own shard", b * g * s * d * B), ("ring output", b * a * s * d * B)]
        out += [("log-sum-exp (fp32)", b * a * s * LSE_BYTES)]
    elif core == "allgather":
        out = [("q (after RoPE)", b * a * s * d * B), ("k repeated to all heads, all s tokens", b * a * S * d * B)]
        out += [("causal mask [s/n, s] (bool)", s * S if causal else 0)]
        out += [("attention probabilities [s/n, s]", b * a * s * S * B)]
        out += [("v repeated to all heads, all s tokens", b * a * S * d * B)]
    elif core == "ulysses":
        check_ulysses(x.cp, a, g)
        ah = a // x.cp
        out = [("q, all s tokens, a/n heads", b * ah * S * d * B), ("k repeated to a/n heads", b * ah * S * d * B)]
        out += [("causal mask [s, s] (bool)", S * S if causal else 0)]
        out += [
            ("attention probabilities, a/n heads", b * ah * S * S * B),
            ("v repeated to a/n heads", b * ah * S * d * B),
        ]
    else:
        raise ValueError(f"attention core must be one of {', '.join(CORES)}; got {core!r}")
    return [rope] + [Tensor(n, v, "core") for n, v in out] + rerun


def ours_block(
    cfg: ModelConfig,
    x: Local,
    *,
    core: str = "eager",
    causal: bool = True,
    moe: dict | None = None,
    routed: int | None = None,
) -> list[Tensor]:
    """Every tensor one block of our GPT saves on a rank with local shapes ``x``, in forward order.
    ``core``: the attention kernel (module docstring). ``moe``: None (SwiGLU), or a mixture of
    experts' MLP tensors ({name: bytes}: ``theory.inventory.moe``, an estimate or the exact count);
    ``routed``: the tokens its router reads on this rank (1/tp of the region's under TP, with no
    gathered region input saved), which sets the MLP norm's saved output to routed·h."""
    b, s, h, B, f = x.b, x.s, x.h, x.B, x.f
    out = [Tensor("block input (kept for recomputation)", b * x.sn * h * B, "input")]
    out += _norm(x, "attn", "input", "output (q/k/v input)") + _core(x, core, causal)
    out += [Tensor("attention output (o_proj input)", b * s * x.a * x.d * B)]
    mlp_norm = _norm(x, "mlp", "input (residual sum)", "output (gate/up input)")
    if routed is not None:  # the router reads this rank's own tokens
        mlp_norm[-1] = Tensor(mlp_norm[-1].name, routed * h * B)
    out += mlp_norm
    if moe is None:
        names = ("gate_proj output", "silu(gate)", "up_proj output", "silu(gate) * up (down_proj input)")
        return out + [Tensor(name, b * s * f * B) for name in names]
    return out + [Tensor(name, n) for name, n in moe.items()]


def ours_ends(cfg: ModelConfig, x: Local, *, tp: int | None = None) -> tuple[dict, dict]:
    """({first stage's tensors}, {last stage's}) outside the blocks for one micro-batch of s tokens:
    the int64 token ids; the final norm, log-probabilities (b·s·V), int64 targets and nll_loss's 0-d
    total_weight. With ``tp`` (1 included) our vocabulary-parallel embedding and loss (``parallel.tp.model``): the
    local ids and their "owned by another rank" mask, the final norm on sn tokens and the head's
    input, the loss's fp32 softmax over this rank's V/t columns, the targets."""
    b, s, sn, h, B, V = x.b, x.s, x.sn, x.h, x.B, cfg.vocab_size
    if tp is None:
        first = {"tokens (int64)": b * s * INDEX_BYTES}
        last = {"final norm": (3 * b * s * h + b * s) * B, "log-probabilities": b * s * V * B}
        return first, last | {"targets (int64)": b * s * INDEX_BYTES, "loss total_weight": B}
    first = {"embedding: local ids (int64) and mask (bool)": b * s * (INDEX_BYTES + MASK_BYTES)}
    last = {"final norm": (2 * b * sn * h + b * sn) * B, "head input": b * x.s_in * h * B}
    return first, last | {"softmax over V/t (fp32)": b * s * (V // tp) * 4, "targets (int64)": b * s * INDEX_BYTES}


# ---- production kernels ------------------------------------------------------------------------
def production_block(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool | None = None,
    dtype_bytes: int = 2,
    attention: str = "flash",
    mlp: str = "swiglu",
    norm: str = "rmsnorm",
    dropout: bool = False,
    moe: bool = False,
) -> list[Tensor]:
    """A layer's tensors under Megatron-LM's kernels on one rank of tp = t (SP whenever t > 1 unless
    told), cp: the formulas of ``theory.inventory.prod_activations``. Sizes are floats (exact divisions)."""
    sp = tp > 1 if sequence_parallel is None else sequence_parallel
    t, s, b, h, B = tp, seq_len // cp, micro_batch, cfg.hidden, dtype_bytes
    a, g, d, f = cfg.n_heads, cfg.kv_heads, cfg.dim_head, cfg.ffn_hidden
    sbh = s * b * h * B
    rep = sbh / t if sp else sbh  # a tensor outside the tensor-parallel regions (its shard under SP)
    stats = LSE_BYTES * s * b / (t if sp else 1) if norm == "rmsnorm" else 0.0
    out = [Tensor("layer input (kept for recomputation)", rep, "input")]
    out += [Tensor("attn norm: input", rep), Tensor("attn norm: statistics", stats)]
    out += [Tensor("attn: qkv input (norm output)", rep)]
    if attention == "flash":
        out += [Tensor("attn: q", s * b * a * d * B / t), Tensor("attn: k, v (kv heads)", 2 * s * b * g * d * B / t)]
        out += [Tensor("attn: log-sum-exp (fp32)", LSE_BYTES * s * b * a / t, "core")]
    else:  # eager: Q and K for QKᵀ, V for the product with the probabilities
        out += [Tensor("attn: q, k", 2 * s * b * a * d * B / t), Tensor("attn: v", s * b * a * d * B / t)]
        out += [Tensor("attn: softmax output", a * s * s * b * B / t, "core")]
        if dropout:
            out += [Tensor("attn: dropout mask", a * s * s * b / t, "core")]
            out += [Tensor("attn: dropout output", a * s * s * b * B / t, "core")]
    out += [Tensor("attn: output (o_proj input)", s * b * a * d * B / t)]
    if dropout:
        out += [Tensor("attn: residual dropout mask", s * b * h / (t if sp else 1))]
    out += [Tensor("mlp norm: input", rep), Tensor("mlp norm: statistics", stats)]
    out += [Tensor("mlp: fc1 input (norm output)", rep)]
    if moe:  # at even routing: each token's k copies and the shared experts
        k, fe, shared = cfg.top_k, cfg.expert_ffn_hidden, cfg.n_shared_experts
        out += [
            Tensor("moe: router probabilities", s * b * cfg.n_experts * B / (t if sp else 1)),
            Tensor("moe: dispatched tokens", s * b * k * h * B / t),
            Tensor("moe: expert fc1 output", 2 * s * b * (k + shared) * fe * B / t),
            Tensor("moe: expert SwiGLU output", s * b * (k + shared) * fe * B / t),
        ]
    elif mlp == "swiglu":
        out += [Tensor("mlp: fc1 output (gate, up)", 2 * s * b * f * B / t)]
        out += [Tensor("mlp: SwiGLU output (fc2 input)", s * b * f * B / t)]
    else:  # GeLU: its input and output
        out += [Tensor("mlp: GeLU input", s * b * f * B / t), Tensor("mlp: GeLU output", s * b * f * B / t)]
    if dropout:
        out += [Tensor("mlp: dropout mask", s * b * h / (t if sp else 1))]
    return out
