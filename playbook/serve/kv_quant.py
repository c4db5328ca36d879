"""An 8-bit paged KV cache: int8 or fp8 (e4m3) keys and values with one scale per block.

Each physical block holds, per layer, K and V of ``block_size`` tokens in one byte
([n_layers, n_blocks, g, block_size, d] each) and one fp32 scale per layer, per K and V, per KV
head ([n_layers, n_blocks, g] each): ``k[t] ≈ s_k · q_k[t]`` inside the block. A scale per block
(rather than per tensor, as vLLM's static fp8 ``k_scale``/``v_scale``) follows the group-wise KV
quantization of KIVI (Liu et al. 2024, arXiv:2402.02750, §3) and KVQuant (Hooper et al. 2024,
arXiv:2401.18079): an outlier token only coarsens the block it is in. The bytes of a block are
``theory.serving.serving.kv_block_bytes`` (the data plus the scale term).

A block fills token by token while decoding, so its scale is the running max|x| / qmax of what it
holds: when a new token's max exceeds it, the block's earlier tokens are requantized at the larger
scale (rounded twice; the price of not keeping a 16-bit copy). A full block's scale never changes
again. Attention reads the block dequantized (``q · s`` in fp32), as a dequantizing attention
kernel would. ``make_cache`` builds the cache of any ``--kv-dtype``: fp32 as before, bf16 and fp16
stored as such (read back as fp32), int8 and fp8 as here; with ``prefix=True`` the same on top of
``serve.prefix.PrefixKVCache`` (shared blocks are full, so their scales are fixed).
"""

from __future__ import annotations

import torch

from playbook.serve.kv import PagedKVCache
from playbook.serve.prefix import PrefixKVCache
from playbook.serve.quant import STORAGE, scale_for, to_format
from playbook.theory.serving.quantized import KV_DTYPES

FLOAT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class _CastRead:
    """A 16-bit cache: stored in ``dtype``, read back as fp32 for the attention."""

    def read(self, layer: int, seq: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = super().read(layer, seq, tokens)  # [g, tokens, d] in the stored dtype
        return k.float(), v.float()


class _Quantized:
    """Mixed into a ``PagedKVCache``: 8-bit storage and per-block scales (see the module docstring)."""

    def __init__(self, *, fmt: str, **kwargs):
        super().__init__(**kwargs)  # fp32 tensors of the right shape, replaced at once
        self.fmt = fmt
        shape = self.k.shape  # [n_layers, n_blocks, g, block_size, d]
        self.k = torch.zeros(shape, dtype=STORAGE[fmt])
        self.v = torch.zeros(shape, dtype=STORAGE[fmt])
        self.k_scale = torch.ones(shape[:3])  # [n_layers, n_blocks, g] fp32
        self.v_scale = torch.ones(shape[:3])

    @property
    def block_bytes(self) -> int:
        """Bytes of one block, read off the tensors: 8-bit K and V, plus their scales."""
        data = self.k[:, 0].numel() * self.k.element_size()  # [n_layers, g, block_size, d]
        scales = self.k_scale[:, 0].numel() * self.k_scale.element_size()  # [n_layers, g]
        return 2 * (data + scales)

    def _put(self, store, scales, layer: int, block: int, lo: int, x: torch.Tensor) -> None:
        """Write x [g, n, d] at slots lo..lo+n of ``block``, growing its scale [g] if x needs it."""
        amax = x.abs().amax((1, 2))  # [g]
        if lo == 0:
            new = scale_for(amax, self.fmt)  # a fresh block: its first tokens set the scale
        else:
            old = scales[layer, block]  # [g]
            new = torch.maximum(old, scale_for(amax, self.fmt))
            if bool((new > old).any()):  # requantize what the block holds at the larger scale
                held = store[layer, block, :, :lo].float() * old[:, None, None]  # [g, lo, d]
                store[layer, block, :, :lo] = to_format(held, new[:, None, None], self.fmt)
        scales[layer, block] = new
        store[layer, block, :, lo : lo + x.shape[1]] = to_format(x, new[:, None, None], self.fmt)

    def write(self, layer: int, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [g, s, d] at positions lengths[seq] .. + s, block by block."""
        start, i, s = self.lengths[seq], 0, k.shape[1]
        while i < s:
            pos = start + i
            block, lo = self.tables[seq][pos // self.block_size], pos % self.block_size
            n = min(self.block_size - lo, s - i)  # tokens that go into this block
            self._put(self.k, self.k_scale, layer, block, lo, k[:, i : i + n])
            self._put(self.v, self.v_scale, layer, block, lo, v[:, i : i + n])
            i += n

    def read(self, layer: int, seq: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [g, tokens, d] dequantized in fp32, gathered block by block."""
        blocks = torch.tensor(self.tables[seq][: self.blocks_for(tokens)])
        out = []
        for store, scales in ((self.k, self.k_scale), (self.v, self.v_scale)):
            x = store[layer, blocks].float() * scales[layer, blocks][..., None, None]  # [nb, g, bs, d]
            out.append(x.transpose(0, 1).flatten(1, 2)[:, :tokens])  # [g, tokens, d]
        return out[0], out[1]


class QuantizedPagedKVCache(_Quantized, PagedKVCache):
    """A ``PagedKVCache`` in int8 or fp8 with per-block scales."""


class QuantizedPrefixKVCache(_Quantized, PrefixKVCache):
    """A ``PrefixKVCache`` in int8 or fp8 with per-block scales."""


class HalfPagedKVCache(_CastRead, PagedKVCache):
    """A ``PagedKVCache`` stored in bf16 or fp16."""


class HalfPrefixKVCache(_CastRead, PrefixKVCache):
    """A ``PrefixKVCache`` stored in bf16 or fp16."""


def check_kv_dtype(kv_dtype: str) -> None:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"--kv-dtype {kv_dtype} is not one of {', '.join(KV_DTYPES)}; try --kv-dtype int8")


def make_cache(kv_dtype: str = "fp32", *, prefix: bool = False, **kwargs) -> PagedKVCache:
    """The paged cache (``prefix``: with prefix caching) storing K and V as ``kv_dtype``."""
    check_kv_dtype(kv_dtype)
    if kv_dtype in STORAGE:
        return (QuantizedPrefixKVCache if prefix else QuantizedPagedKVCache)(fmt=kv_dtype, **kwargs)
    if kv_dtype == "fp32":
        return (PrefixKVCache if prefix else PagedKVCache)(**kwargs)
    return (HalfPrefixKVCache if prefix else HalfPagedKVCache)(dtype=FLOAT[kv_dtype], **kwargs)
