"""Context parallelism, predicted: who holds which tokens, who computes which attention block,
how many bytes move, and how much activation memory a rank keeps. Pure Python, no torch.

Notation: s sequence length, n context-parallel ranks (``cp``), b micro-batch, a query heads,
g key/value heads, d head dim, B bytes per element. A rank holds s/n tokens of every sequence.

Sharding (``shard_chunks``). The sequence is cut into equal chunks:
- contiguous: n chunks, rank i holds chunk i;
- zig-zag: 2n chunks, rank i holds chunks i and 2n−1−i, so that every rank owns one early and one
  late chunk (the layout of Llama 3's context parallelism, Dubey et al. 2024, arXiv:2407.21783
  §3.3.2, and of the open-source ring-flash-attention; Brandon et al. 2023, "Striped Attention",
  arXiv:2311.09431, balance with a round-robin layout instead).

Ring attention (Liu et al. 2023, arXiv:2310.01889). Rank i keeps its queries; at step t = 0..n−1 it
holds the keys/values of rank (i − t) mod n and passes them on to rank i+1. Between a query chunk
p and a key chunk q (chunk indices along the sequence) the causal mask leaves
``q < p`` fully visible, ``q == p`` a triangle (the diagonal block, computed with a mask), and
``q > p`` fully masked: that block is skipped. Counting computed chunk pairs per rank:

    contiguous:  rank i computes i + 1 blocks of (s/n)²           (rank n−1 does n times rank 0's work)
    zig-zag:     every rank computes 2n + 1 blocks of (s/2n)²     (exactly balanced)

In tiles of (s/2n)² that is 4(i+1) vs 2n+1: zig-zag's slowest rank finishes after (2n+1)/(4n) ≈ ½
of contiguous's slowest rank. Without the mask every rank computes n (contiguous) or 4n (zig-zag)
blocks, s²/n score elements.

Bytes per layer per training step (forward + backward), sent by one rank (``comm_bytes_per_layer``):
with KV = 2·b·g·(s/n)·d·B the bytes of one rank's key and value shard,
- ring: forward (n−1)·KV; backward (n−1)·KV again plus (n−1)·KV of key/value gradients travelling
  with them (each rank keeps its own block's gradient, so the accumulator needs n−1 hops): 3(n−1)·KV
  (the gradients travel in fp32, so with 16-bit activations that part doubles);
- all-gather: all-gather K,V forward, reduce-scatter their gradients backward: 2(n−1)·KV, and a
  rank holds all s keys and values at once;
- Ulysses (Jacobs et al. 2023, arXiv:2309.14509, §3.1): all-to-all q, k, v to head shards and the
  output back, and the same four in backward; an all-to-all sends (n−1)/n of its buffer:
  2·(n−1)/n·(2·b·a·(s/n)·d + 2·b·g·(s/n)·d)·B. With a = g and n ≫ 1 that is 8bsh·B/n per layer per
  step, the paper's "4Nh/P per link" (per pass) — it falls with n, where the ring's does not.

Overlap (Liu et al. 2023, §3): a ring step hides its transfer when computing one block takes at
least as long as sending one K/V block: 4·b·a·c²·d FLOPs / peak ≥ 2·b·g·c·d·B / bandwidth for a
block of c = s/n query and key tokens, i.e. c ≥ g·B·peak / (2·a·bandwidth) (``overlap``).

Units: bytes, FLOPs, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from playbook.config import ModelConfig, divisors, require_positive
from playbook.theory.inventory.inventory import check_ulysses, local, ours_block, view

VARIANTS = ("ring", "allgather", "ulysses")
GRAD_BYTES = 4  # ... and accumulates the travelling key/value gradients in fp32


# ---- layout ------------------------------------------------------------------------------------
def check_layout(seq_len: int, n: int, zigzag: bool) -> None:
    """Raise ``ValueError`` unless ``seq_len`` splits into n (or 2n for zig-zag) equal chunks."""
    require_positive(seq_len=seq_len, cp=n)
    parts = 2 * n if zigzag else n
    if seq_len % parts:
        what = f"2·cp = {parts} chunks (zig-zag)" if zigzag else f"cp = {n} shards"
        good = [m for m in divisors(seq_len) if seq_len % (2 * m if zigzag else m) == 0 and m <= 64]
        raise ValueError(
            f"seq_len={seq_len} does not split into {what}; use a seq_len that is a multiple of {parts}, "
            f"or cp in {{{', '.join(map(str, good))}}}"
        )


def shard_chunks(n: int, zigzag: bool) -> list[list[int]]:
    """Chunk indices each rank holds: contiguous [[0], [1], ...]; zig-zag [[0, 2n-1], [1, 2n-2], ...]."""
    require_positive(cp=n)
    if zigzag:
        return [[i, 2 * n - 1 - i] for i in range(n)]
    return [[i] for i in range(n)]


def shard_positions(seq_len: int, n: int, rank: int, zigzag: bool) -> list[int]:
    """The global token positions rank ``rank`` holds, in the order it holds them."""
    check_layout(seq_len, n, zigzag)
    c = seq_len // (2 * n if zigzag else n)
    return [p for chunk in shard_chunks(n, zigzag)[rank] for p in range(chunk * c, (chunk + 1) * c)]


# ---- work --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    """One attention block a rank computes at one ring step: query chunk × key chunk."""

    step: int
    rank: int  # who computes it (owns the queries)
    source: int  # whose keys/values they are
    q_chunk: int
    k_chunk: int
    diagonal: bool  # computed with a triangular mask


def ring_schedule(n: int, zigzag: bool, causal: bool = True) -> list[Block]:
    """Every block ring attention computes, in order: at step t rank i holds the keys/values of rank
    (i − t) mod n; fully masked chunk pairs (key chunk after query chunk) are skipped."""
    chunks = shard_chunks(n, zigzag)
    out = []
    for step in range(n):
        for rank in range(n):
            source = (rank - step) % n
            for p in chunks[rank]:
                for q in chunks[source]:
                    if causal and q > p:
                        continue
                    out.append(Block(step, rank, source, p, q, causal and q == p))
    return out


def ring_blocks_per_rank(n: int, zigzag: bool, causal: bool = True) -> list[int]:
    """Closed form of ``len(ring_schedule)`` per rank: causal contiguous i+1, zig-zag 2n+1;
    without the mask n (contiguous) or 4n (zig-zag)."""
    require_positive(cp=n)
    if not causal:
        return [4 * n if zigzag else n] * n
    return [2 * n + 1] * n if zigzag else [i + 1 for i in range(n)]


def ring_work_per_rank(seq_len: int, n: int, zigzag: bool, causal: bool = True) -> list[int]:
    """Attention score elements (query × key pairs, per head and sequence) each rank computes:
    blocks × chunk². Diagonal blocks are computed whole (masked), so they count fully."""
    check_layout(seq_len, n, zigzag)
    c = seq_len // (2 * n if zigzag else n)
    return [blocks * c * c for blocks in ring_blocks_per_rank(n, zigzag, causal)]


def imbalance(work: list[float]) -> float:
    """max / mean − 1: 0 is perfectly balanced; the slowest rank sets the step time."""
    mean = sum(work) / len(work)
    return max(work) / mean - 1 if mean else 0.0


# ---- bytes -------------------------------------------------------------------------------------
def kv_shard_bytes(cfg: ModelConfig, *, seq_len: int, micro_batch: int, cp: int, dtype_bytes: int = 4) -> int:
    """Bytes of one rank's key and value shard for one layer: 2·b·g·(s/n)·d·B."""
    return 2 * micro_batch * cfg.kv_heads * (seq_len // cp) * cfg.dim_head * dtype_bytes


def comm_bytes_per_layer(
    cfg: ModelConfig, *, seq_len: int, micro_batch: int, cp: int, variant: str, dtype_bytes: int = 4
) -> dict[str, float]:
    """Bytes one rank sends for one layer's attention in one training step (forward + backward),
    by the ``torch.distributed`` op that carries them (the module docstring derives each)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    n = cp
    if n == 1:
        return {}
    kv = kv_shard_bytes(cfg, seq_len=seq_len, micro_batch=micro_batch, cp=n, dtype_bytes=dtype_bytes)
    if variant == "ring":  # K/V forward and backward, and their gradients (kept in fp32 at least)
        return {"batch_isend_irecv": float((n - 1) * (2 * kv + kv * max(GRAD_BYTES, dtype_bytes) // dtype_bytes))}
    if variant == "allgather":
        return {"all_gather_single": float((n - 1) * kv), "reduce_scatter_single": float((n - 1) * kv)}
    check_ulysses(n, cfg.n_heads, cfg.kv_heads)
    q = micro_batch * cfg.n_heads * (seq_len // n) * cfg.dim_head * dtype_bytes  # q, and the output
    return {"all_to_all_single": 2 * (n - 1) / n * (2 * q + kv)}


def comm_bytes_per_step(
    cfg: ModelConfig, *, seq_len: int, micro_batch: int, cp: int, variant: str, dtype_bytes: int = 4
) -> dict[str, float]:
    """Bytes one rank sends per training step: every layer's attention, plus the all-reduce that
    sums the replicated weights' gradients over the cp ranks (2·(n−1)/n·4Ψ in fp32) and the loss
    (one scalar, 2·(n−1)/n·B)."""
    out = {
        op: cfg.n_layers * v
        for op, v in comm_bytes_per_layer(
            cfg, seq_len=seq_len, micro_batch=micro_batch, cp=cp, variant=variant, dtype_bytes=dtype_bytes
        ).items()
    }
    if cp > 1:
        out["all_reduce"] = 2 * (cp - 1) / cp * (cfg.num_params() + 1) * dtype_bytes
    return out


# ---- activation memory -------------------------------------------------------------------------
def cp_block_activation_breakdown(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    cp: int,
    variant: str = "ring",
    dtype_bytes: int = 4,
    causal: bool = True,
) -> dict[str, int]:
    """Bytes one block of our GPT saves for backward on one rank under context parallelism.

    As ``playbook.theory.inventory.activations.block_activation_breakdown`` with s → s/n for everything
    outside attention, plus RoPE's cos/sin gathered at this rank's explicit positions (4·(s/n)·d),
    and the attention core per variant:
    - ring: the custom autograd function keeps q, k, v, its output and the fp32 log-sum-exp; no
      s² tensor at all (the backward recomputes each block's probabilities, as FlashAttention does);
    - all-gather: k and v repeated to a heads for the matmuls (b·a·s·d each: all s tokens), the
      [s/n, s] mask and the b·a·(s/n)·s probabilities. The gathered K, V themselves are not kept:
      only their repeated copies are, which is where the memory goes;
    - Ulysses: plain attention over the full sequence for a/n heads: q, the repeated k and v,
      the [s, s] mask and b·(a/n)·s² probabilities; then the output travels back.
    Without the causal mask (``causal=False``) the boolean mask is not kept.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    if seq_len % cp:
        raise ValueError(f"seq_len={seq_len} does not split over cp={cp}; use a multiple of {cp}")
    x = local(cfg, seq_len=seq_len, micro_batch=micro_batch, cp=cp, dtype_bytes=dtype_bytes)
    return view(ours_block(cfg, x, core=variant, causal=causal))


def cp_activation_bytes(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    cp: int,
    variant: str = "ring",
    dtype_bytes: int = 4,
    causal: bool = True,
    recompute: str = "none",
) -> int:
    """Bytes one rank saves for one forward of the whole model and its loss under cp = n: the
    blocks (``cp_block_activation_breakdown``) and, at s/n tokens, the token ids and targets
    (int64), the final norm (3·b·(s/n)·h + b·(s/n)), the log-probabilities b·(s/n)·V and the
    loss's 0-d ``total_weight``, as in ``playbook.theory.inventory.activations.model_activation_bytes``.
    The lead wires this into ``training_memory(cp=n)``. Only ``recompute="none"`` is counted (and
    measured): the CP forward here does not checkpoint; note that the ring kernel already
    recomputes its probabilities, so for the ring "selective" would change nothing."""
    if recompute != "none":
        raise NotImplementedError(
            f"recompute={recompute!r} with context parallelism is not modelled; use recompute='none'"
        )
    block = sum(
        cp_block_activation_breakdown(
            cfg,
            seq_len=seq_len,
            micro_batch=micro_batch,
            cp=cp,
            variant=variant,
            dtype_bytes=dtype_bytes,
            causal=causal,
        ).values()
    )
    b, s, h, V, B = micro_batch, seq_len // cp, cfg.hidden, cfg.vocab_size, dtype_bytes
    return cfg.n_layers * block + 2 * 8 * b * s + (3 * b * s * h + b * s + b * s * V + 1) * B


# ---- overlap -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Overlap:
    """One ring step on a hardware profile: compute one block vs send one K/V block."""

    block_tokens: int
    compute_seconds: float
    transfer_seconds: float
    min_shard_tokens: float  # the smallest s/n for which compute hides the transfer

    @property
    def hidden(self) -> bool:
        return self.compute_seconds >= self.transfer_seconds


def overlap(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    cp: int,
    peak_flops: float,
    bandwidth: float,
    dtype_bytes: int = 2,
    zigzag: bool = False,
) -> Overlap:
    """Liu et al. 2023 §3: a block of c query × c key tokens costs 4·b·a·c²·d FLOPs forward (q·kᵀ and
    p·v, 2 FLOPs per multiply-add) and its K/V shard 2·b·g·c'·d·B bytes, c' = s/n the tokens a rank
    sends (zig-zag blocks are half as wide, c = s/2n, but a rank still sends all its s/n tokens
    and computes 2 such blocks per step off the diagonal). Overlap holds when compute ≥ transfer,
    i.e. s/n ≥ g·B·peak / (2·a·bandwidth) contiguous, twice that zig-zag."""
    require_positive(seq_len=seq_len, micro_batch=micro_batch, cp=cp)
    b, a, g, d = micro_batch, cfg.n_heads, cfg.kv_heads, cfg.dim_head
    shard = seq_len // cp
    c, blocks = (shard // 2, 2) if zigzag else (shard, 1)
    flops = blocks * 4 * b * a * c * c * d
    sent = 2 * b * g * shard * d * dtype_bytes
    return Overlap(
        block_tokens=c,
        compute_seconds=flops / peak_flops,
        transfer_seconds=sent / bandwidth,
        min_shard_tokens=g * dtype_bytes * peak_flops / (2 * a * bandwidth) * (2 if zigzag else 1),
    )
