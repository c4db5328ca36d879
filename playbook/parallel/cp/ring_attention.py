"""Attention over a sequence split across ranks: three ways to let local queries see remote keys.

Every rank holds s/n tokens of each sequence (their global positions come from
``playbook.theory.cp.shard_positions``: contiguous, or zig-zag for causal balance). q, k, v are
``[batch, heads, s/n, head_dim]`` (k, v with kv_heads ≤ heads: grouped-query attention).

- ``ring_attention`` (Liu et al. 2023, "Ring Attention with Blockwise Transformers",
  arXiv:2310.01889): keys/values travel around the ring with point-to-point sends; each arriving
  block's partial softmax is merged by the log-sum-exp rule (Milakov & Gimelshein 2018, "Online
  normalizer calculation for softmax"; Dao et al. 2022, FlashAttention, arXiv:2205.14135):

      m = logaddexp(lse₁, lse₂),   out = e^(lse₁−m)·out₁ + e^(lse₂−m)·out₂

  The backward is written by hand: it recomputes each block's probabilities from the saved lse
  (no s² tensor is ever stored), and passes key/value *gradients* around the ring with the blocks,
  so a rank holds a few blocks of keys, values and their gradients at a time, whatever n is.
- ``allgather_attention``: gather all keys and values (all-gather forward, reduce-scatter of
  their gradients backward), then ordinary attention for the local queries. Simple; every rank
  holds the whole sequence's K/V.
- ``ulysses_attention`` (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509): all-to-all
  turns "all heads, s/n tokens" into "heads/n, all s tokens", attention runs locally, and a second
  all-to-all turns the output back.

The collectives are ``torch.distributed`` calls inside our own ``autograd.Function``s, on
contiguous buffers (``torch.distributed.nn.functional.all_gather`` gives silently wrong gradients
for a non-contiguous incoming gradient on gloo: the appendix's case 4), so the tracer sees every byte.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from playbook.cluster.trace import tracer as trace
from playbook.parallel.comm import _neighbours, _wait, gather_shards, ring_pass
from playbook.theory.cp import check_layout, shard_chunks, shard_positions
from playbook.theory.inventory.inventory import check_ulysses


# ---- pieces shared by every variant -------------------------------------------------------------
def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """[b, g, s, d] -> [b, g·group, s, d]: key/value head j serves query heads j·group .. (j+1)·group−1."""
    b, g, s, d = x.shape
    return x[:, :, None].expand(b, g, group, s, d).reshape(b, g * group, s, d)


def sum_kv(dx: torch.Tensor, group: int) -> torch.Tensor:
    """The adjoint of ``repeat_kv``: [b, g·group, s, d] -> [b, g, s, d], summing each group."""
    b, a, s, d = dx.shape
    return dx.view(b, a // group, group, s, d).sum(2)


def attention(q, k, v, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """softmax(q kᵀ/√d + mask) v, with the mask from global positions (key after query: hidden).

    q [b, a, sq, d], k/v [b, g, sk, d]; positions [sq], [sk] int64. Plain autograd, the local core
    of the all-gather and Ulysses variants, and with whole positions the single-process reference.
    """
    group = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, group), repeat_kv(v, group)  # [b, a, sk, d]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # [b, a, sq, sk]
    if causal:
        future = k_pos[None, :] > q_pos[:, None]  # [sq, sk]
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(dim=-1) @ v  # [b, a, sq, d]


def _span(name: str):
    tracer = trace.current()
    return tracer.span(name) if tracer is not None else nullcontext()


def _block_record(step, rank, n, chunks, i, j, c, diag, pass_, cpu) -> dict:
    """What one ring block did, for the chapter's work-balance figure (``cpu``: thread time at its start)."""
    k_chunk = chunks[(rank - step) % n][j]
    return dict(
        step=step,
        q_chunk=chunks[rank][i],
        k_chunk=k_chunk,
        rows=c,
        cols=c,
        diagonal=diag,
        pass_=pass_,
        cpu_seconds=time.thread_time() - cpu,
    )


# ---- ring attention ------------------------------------------------------------------------------
def _blocks(step: int, rank: int, n: int, chunks: list[list[int]], causal: bool):
    """The (local query chunk, remote key chunk, diagonal) triples to compute at ``step``:
    key chunk after query chunk is fully masked under causality, so it is skipped."""
    for i, p in enumerate(chunks[rank]):
        for j, q in enumerate(chunks[(rank - step) % n]):
            if not (causal and q > p):
                yield i, j, causal and q == p


def _scores(q, k, diagonal: bool, scale: float) -> torch.Tensor:
    """q [b, a, c, d] · k [b, a, c, d] -> scaled scores [b, a, c, c], the upper triangle masked on the diagonal."""
    s = (q @ k.transpose(-2, -1)) * scale  # [b, a, c, c]
    if diagonal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


class RingAttention(torch.autograd.Function):
    """Ring attention with a hand-written ring backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, group, chunks, causal, log):
        rank, n, _, _ = _neighbours(group)
        c = q.shape[2] // len(chunks[rank])  # tokens per chunk
        scale = 1.0 / math.sqrt(q.shape[-1])
        rep = q.shape[1] // k.shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)  # softmax statistics in fp32 at least
        out = torch.zeros(q.shape, dtype=acc, device=q.device)  # [b, a, s/n, d]
        lse = torch.full(q.shape[:3], float("-inf"), dtype=acc, device=q.device)  # [b, a, s/n]
        kv = torch.stack([k, v])  # [2, b, g, s/n, d], one contiguous buffer travels
        for step in range(n):
            if step < n - 1:  # start the next transfer before computing: overlap
                nxt, works = ring_pass(kv, group)
            for i, j, diag in _blocks(step, rank, n, chunks, causal):
                rows, cols = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
                cpu = time.thread_time()  # this thread's CPU time: blind to waiting and to other ranks
                with _span("ring block forward"):
                    kb, vb = repeat_kv(kv[0, :, :, cols], rep), repeat_kv(kv[1, :, :, cols], rep)  # [b, a, c, d]
                    s = _scores(q[:, :, rows], kb, diag, scale).to(acc)  # [b, a, c, c]
                    block_lse = s.logsumexp(-1)  # [b, a, c]
                    block_out = torch.exp(s - block_lse[..., None]).to(vb.dtype) @ vb  # [b, a, c, d]
                    new = torch.logaddexp(lse[:, :, rows], block_lse)  # [b, a, c]
                    out[:, :, rows] = (
                        out[:, :, rows] * torch.exp(lse[:, :, rows] - new)[..., None]
                        + block_out * torch.exp(block_lse - new)[..., None]
                    )
                    lse[:, :, rows] = new
                if log is not None:
                    log.append(_block_record(step, rank, n, chunks, i, j, c, diag, "forward", cpu))
            if step < n - 1:
                _wait(works)
                kv = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.chunks, ctx.causal, ctx.log = group, chunks, causal, log
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, chunks, causal = ctx.group, ctx.chunks, ctx.causal
        rank, n, _, _ = _neighbours(group)
        c = q.shape[2] // len(chunks[rank])
        scale = 1.0 / math.sqrt(q.shape[-1])
        rep = q.shape[1] // k.shape[1]
        acc = torch.promote_types(q.dtype, torch.float32)
        D = (dout.to(acc) * out.to(acc)).sum(-1)  # [b, a, s/n]: rowsum(dO ∘ O), FlashAttention's D
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)  # [b, a, s/n, d]
        kv = torch.stack([k, v])  # [2, b, g, s/n, d]
        own = torch.zeros(kv.shape, dtype=acc, device=q.device)  # dK, dV of our own block
        travelling = None  # dK, dV of the block we hold now, travelling with it
        for step in range(n):
            if step < n - 1:
                nxt, works = ring_pass(kv, group)
            grad = own if step == 0 else travelling
            for i, j, diag in _blocks(step, rank, n, chunks, causal):
                rows, cols = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
                cpu = time.thread_time()
                with _span("ring block backward"):
                    qb, dob = q[:, :, rows], dout[:, :, rows]  # [b, a, c, d]
                    kb, vb = repeat_kv(kv[0, :, :, cols], rep), repeat_kv(kv[1, :, :, cols], rep)  # [b, a, c, d]
                    p = torch.exp(_scores(qb, kb, diag, scale).to(acc) - lse[:, :, rows, None])  # [b, a, c, c]
                    grad[1, :, :, cols] += sum_kv(p.transpose(-2, -1).to(dob.dtype) @ dob, rep).to(acc)  # dV
                    dp = (dob @ vb.transpose(-2, -1)).to(acc)  # [b, a, c, c]
                    ds = p * (dp - D[:, :, rows, None])  # [b, a, c, c]: softmax backward
                    dq[:, :, rows] += (ds.to(kb.dtype) @ kb).to(acc) * scale
                    grad[0, :, :, cols] += sum_kv(ds.transpose(-2, -1).to(qb.dtype) @ qb, rep).to(acc) * scale  # dK
                if ctx.log is not None:
                    ctx.log.append(_block_record(step, rank, n, chunks, i, j, c, diag, "backward", cpu))
            if step < n - 1:
                _wait(works)
                kv = nxt
            if step >= 1:  # hand the gradient on; after the last step it reaches the block's owner
                travelling, works = ring_pass(grad, group)
                _wait(works)
            if step == 0 and n > 1:
                travelling = torch.zeros_like(own)
        if n > 1:
            own += travelling  # everyone else's contribution to our own block, home after n−1 hops
        return dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype), None, None, None, None


def ring_attention(q, k, v, group, *, zigzag: bool, causal: bool = True, log: list | None = None) -> torch.Tensor:
    """Ring attention for this rank's shard: q [b, a, s/n, d], k/v [b, g, s/n, d] -> [b, a, s/n, d].
    ``log`` (a list) receives one dict per block computed (``pass_`` "forward" or "backward"), with the
    block's chunks, size and the CPU seconds this thread spent on it."""
    n = dist.get_world_size(group)
    check_layout(q.shape[2] * n, n, zigzag)
    return RingAttention.apply(q, k, v, group, shard_chunks(n, zigzag), causal, log)


# ---- all-gather K/V ------------------------------------------------------------------------------
def global_positions(seq_len: int, n: int, zigzag: bool, device=None) -> torch.Tensor:
    """Positions of the tokens of all ranks concatenated in rank order: what a gather produces."""
    return torch.tensor([p for r in range(n) for p in shard_positions(seq_len, n, r, zigzag)], device=device)


def allgather_attention(q, k, v, group, *, zigzag: bool, causal: bool = True) -> torch.Tensor:
    """Gather every rank's K and V, then attention of the local queries over all s keys."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    b, g, sl, d = k.shape
    s = sl * n
    check_layout(s, n, zigzag)
    everyone = gather_shards(torch.stack([k, v]), group)  # [n, 2, b, g, s/n, d]
    kv = everyone.permute(1, 2, 3, 0, 4, 5).reshape(2, b, g, s, d)  # [2, b, g, s, d], rank-major tokens
    q_pos = torch.tensor(shard_positions(s, n, rank, zigzag), device=q.device)  # [s/n]
    with _span("attention"):
        return attention(q, kv[0], kv[1], q_pos, global_positions(s, n, zigzag, q.device), causal)


# ---- Ulysses: all-to-all over heads ------------------------------------------------------------
def _seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """[b, H, s/n, d] (all heads, my tokens) -> [b, H/n, s, d] (my heads, everyone's tokens)."""
    n = dist.get_world_size(group)
    b, H, sl, d = x.shape
    send = x.reshape(b, n, H // n, sl, d).transpose(0, 1).contiguous()  # [n, b, H/n, s/n, d]: piece j -> rank j
    recv = torch.empty_like(send)  # recv[j] = rank j's tokens for my heads
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, H // n, n * sl, d)  # [b, H/n, s, d]


def _heads_to_seq(y: torch.Tensor, group) -> torch.Tensor:
    """The inverse: [b, H/n, s, d] -> [b, H, s/n, d]."""
    n = dist.get_world_size(group)
    b, h, s, d = y.shape
    send = y.reshape(b, h, n, s // n, d).permute(2, 0, 1, 3, 4).contiguous()  # [n, b, H/n, s/n, d]: rank j's tokens
    recv = torch.empty_like(send)  # recv[j] = my tokens for rank j's heads
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(0, 1).reshape(b, n * h, s // n, d)  # [b, H, s/n, d]


class SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad, ctx.group), None


class HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        return _heads_to_seq(y, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad, ctx.group), None


def ulysses_attention(q, k, v, group, *, zigzag: bool, causal: bool = True) -> torch.Tensor:
    """All-to-all to head shards, full-sequence attention on heads/n heads, all-to-all back."""
    n = dist.get_world_size(group)
    check_ulysses(n, q.shape[1], k.shape[1])
    s = q.shape[2] * n
    check_layout(s, n, zigzag)
    qh, kh, vh = (SeqToHeads.apply(t, group) for t in (q, k, v))  # [b, a/n, s, d], [b, g/n, s, d] x2
    pos = global_positions(s, n, zigzag, q.device)  # [s], the order the all-to-all delivers tokens in
    with _span("attention"):
        out = attention(qh, kh, vh, pos, pos, causal)  # [b, a/n, s, d]
    return HeadsToSeq.apply(out, group)  # [b, a, s/n, d]


VARIANTS = {"ring": ring_attention, "allgather": allgather_attention, "ulysses": ulysses_attention}
