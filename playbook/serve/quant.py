"""Quantized weights for the served GPT: INT8 or FP8 (e4m3) with one scale per output channel.

Every linear of every block (q, k, v, o; gate, up, down) is replaced by a :class:`QuantizedLinear`
holding ``q`` [out, in] in one byte and ``s`` [out] in fp32, ``w[o, i] ≈ s[o] · q[o, i]``:

- INT8 (LLM.int8(), Dettmers et al. 2022, arXiv:2208.07339, §3.1, vector-wise): s = max|w[o]| / 127,
  q = round(w / s) clamped to [−127, 127] (symmetric, no zero point).
- FP8 e4m3 (Micikevicius et al. 2022, arXiv:2209.05433, §3; ``torch.float8_e4m3fn``): s = max|w[o]| / 448
  (e4m3's largest finite value), q = (w / s) rounded to the nearest e4m3 by the cast.

The matmul dequantizes on the fly: ``y = (x @ q.to(x.dtype)ᵀ) · s``. The scale is per output
channel, so it comes out of the sum and multiplies the output (an int8 GEMM's epilogue does the
same); on CPU there is no int8 or fp8 GEMM here, so ``q`` is cast to fp32 for each matmul and the
run is *slower* than fp32: what this measures is bytes and accuracy, not speed. The embedding, the
head and the norms stay fp32 (vLLM's FP8 checkpoints leave the head and embeddings unquantized).

Tensor parallelism: the shards are cut from the *whole* model's quantization, so TP ranks compute
with exactly the int8 values and scales of one process: a column shard (q, k, v, gate, up) takes
its rows and their scales, a row shard (o, down) its columns and every row's scale; its partial
sums are scaled before the all-reduce, Σ_r (x_r q_rᵀ) s = (x qᵀ) s. Bytes per rank:
``theory.serving.weights.served_weight_bytes``.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from playbook.theory.serving.weights import QUANTIZE, block_linears

STORAGE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
QMAX = {"int8": 127.0, "fp8": 448.0}  # the largest value each format holds (e4m3fn: 448)


def check_format(fmt: str) -> None:
    if fmt not in QUANTIZE:
        raise ValueError(f"quantization {fmt!r} is not one of {', '.join(QUANTIZE)}; try int8")


def to_format(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """x / scale in ``fmt`` (``scale`` broadcast against x): int8 rounded and clamped, fp8 by the cast."""
    y = x / scale
    if fmt == "int8":
        return y.round().clamp(-127, 127).to(torch.int8)
    return y.clamp(-448, 448).to(torch.float8_e4m3fn)


def scale_for(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """The symmetric scale that maps ``amax`` to the format's largest value (never 0: an all-zero
    row keeps scale 1 and stores zeros)."""
    s = amax.float() / QMAX[fmt]
    return torch.where(s > 0, s, torch.ones_like(s))


def quantize_weight(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (q [out, in] in ``fmt``, s [out] fp32), one scale per output channel."""
    check_format(fmt)
    s = scale_for(w.detach().abs().amax(1), fmt)  # [out]
    return to_format(w.detach(), s[:, None], fmt), s


class QuantizedLinear(nn.Module):
    """y = (x @ q.to(x.dtype)ᵀ) · s, then ``after`` (a row-parallel shard's ``Region.leave``: its all-reduce)."""

    def __init__(self, q: torch.Tensor, s: torch.Tensor, after=None):
        super().__init__()
        self.register_buffer("q", q.contiguous())  # [out(/t), in(/t)] int8 or float8_e4m3fn
        self.register_buffer("s", s.contiguous())  # [out(/t)] fp32
        self.after = after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.q.to(x.dtype)) * self.s  # [..., out]: dequantized on the fly
        return self.after(y) if self.after is not None else y

    def nbytes(self) -> int:
        return self.q.numel() * self.q.element_size() + self.s.numel() * self.s.element_size()


def _linears(model) -> list[tuple[str, nn.Module, str]]:
    """(parent name, parent module, attribute) of every block linear, in order."""
    names = set(block_linears(model.cfg))
    out = []
    for name, parent in model.named_modules():
        if not name.startswith("blocks.") or name.count(".") != 2:  # blocks.i.attn, blocks.i.mlp
            continue
        out += [(name, parent, attr) for attr in names if hasattr(parent, attr)]
    return out


@torch.no_grad()
def quantize_model(model, fmt: str, *, reference=None):
    """``model`` (a ``GPT`` or a ``TPGPT`` shard) with every block linear quantized to ``fmt``, from
    the whole ``reference`` GPT's weights (default: ``model`` itself, which is then copied first, so
    the reference is never changed). A ``TPGPT`` is changed in place and returned."""
    check_format(fmt)
    if model.cfg.is_moe:
        raise ValueError(f"{model.cfg.name}: quantized serving covers dense models here; try --model gpt-tiny")
    group = getattr(model, "group", None)
    rank, t = (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)
    if reference is None or reference is model:
        reference = model
        if group is None:
            model = copy.deepcopy(model)
    whole = dict(reference.named_modules())
    for name, parent, attr in _linears(model):
        layer = getattr(parent, attr)
        q, s = quantize_weight(whole[f"{name}.{attr}"].weight, fmt)  # the whole model's [out, in], [out]
        dim = getattr(layer, "shard_dim", None) if t > 1 else None
        if dim == 0:  # column shard: its rows and their scales
            q, s = q.chunk(t, 0)[rank], s.chunk(t)[rank]
        elif dim == 1:  # row shard: its columns, every row's scale
            q = q.chunk(t, 1)[rank]
        region = getattr(layer, "region", None)
        setattr(parent, attr, QuantizedLinear(q, s, region.leave if region is not None else None))
    model.quantized = fmt
    return model


def weight_bytes(model) -> dict:
    """Measured: bytes of ``model``'s weights, read off its tensors: ``linears`` (quantized ``q``, or
    the block linears' weights), ``scales`` and ``other`` (every other parameter, a tied one once)."""
    linears = scales = 0
    seen = set()
    for _, parent, attr in _linears(model):
        layer = getattr(parent, attr)
        if isinstance(layer, QuantizedLinear):
            linears += layer.q.numel() * layer.q.element_size()
            scales += layer.s.numel() * layer.s.element_size()
        else:
            linears += layer.weight.numel() * layer.weight.element_size()
            seen.add(id(layer.weight))
    other = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            other += p.numel() * p.element_size()
    return {"linears": linears, "scales": scales, "other": other, "total": linears + scales + other}
