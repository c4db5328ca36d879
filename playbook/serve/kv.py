"""KV caches: a contiguous one per batch (the reference), and a paged one shared by many requests.

During decoding each layer's keys and values of every past token are kept, so a new token costs
one row of attention instead of a forward over the whole sequence (the KV cache).

``PagedKVCache`` is vLLM's layout (Kwon et al. 2023, "Efficient Memory Management for Large
Language Model Serving with PagedAttention", §4.1–4.2): one pool of fixed-size blocks of
``block_size`` tokens per layer, a free list, and a *block table* per sequence mapping its logical
blocks (tokens 0..15, 16..31, ...) to physical ones anywhere in the pool. A sequence takes a new
block only when its last one is full, and gives all back when it finishes, so memory is wasted only
in each sequence's last block, and sequences of any length share one pool.
"""

from __future__ import annotations

import math

import torch


class KVCache:
    """Per layer and per row (sequence), keys and values [g, n, d] of the n tokens seen so far,
    grown by concatenation: the simplest cache, one contiguous tensor per sequence and layer."""

    def __init__(self, n_layers: int, rows: int):
        self.k: list[list] = [[None] * rows for _ in range(n_layers)]
        self.v: list[list] = [[None] * rows for _ in range(n_layers)]

    def extend(self, layer: int, row: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's k, v [g, s, d]; return every cached token's [g, n + s, d]."""
        if self.k[layer][row] is not None:
            k, v = torch.cat([self.k[layer][row], k], 1), torch.cat([self.v[layer][row], v], 1)  # [g, n+s, d]
        self.k[layer][row], self.v[layer][row] = k, v
        return k, v

    def nbytes(self) -> int:
        """Bytes held: every layer's and row's keys and values."""
        return sum(t.numel() * t.element_size() for rows in (*self.k, *self.v) for t in rows if t is not None)


class PagedKVCache:
    """A pool of ``n_blocks`` blocks of ``block_size`` tokens, each holding k and v for every layer
    ([n_layers, n_blocks, g, block_size, d] each), and a block table per sequence."""

    def __init__(
        self, *, n_layers: int, kv_heads: int, head_dim: int, n_blocks: int, block_size: int = 16, dtype=torch.float32
    ):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"n_blocks and block_size must be >= 1, got {n_blocks} and {block_size}")
        shape = (n_layers, n_blocks, kv_heads, block_size, head_dim)
        self.k, self.v = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
        self.block_size, self.n_blocks = block_size, n_blocks
        self.free: list[int] = list(range(n_blocks))  # lowest first, so tables read in order
        self.tables: dict[int, list[int]] = {}  # sequence id -> physical blocks, in logical order
        self.lengths: dict[int, int] = {}  # sequence id -> tokens written

    @property
    def block_bytes(self) -> int:
        """Bytes of one block: k and v of ``block_size`` tokens in every layer (read off the tensors)."""
        one = self.k[:, 0]  # [n_layers, g, block_size, d]
        return 2 * one.numel() * one.element_size()

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def add(self, seq: int) -> None:
        if seq in self.tables:
            raise ValueError(f"sequence {seq} is already in the cache")
        self.tables[seq], self.lengths[seq] = [], 0

    def reserve(self, seq: int, tokens: int) -> None:
        """Take free blocks until ``seq`` has room for ``tokens`` more tokens."""
        need = self.blocks_for(self.lengths[seq] + tokens) - len(self.tables[seq])
        if need > len(self.free):
            raise RuntimeError(f"KV cache full: sequence {seq} needs {need} more block(s), {len(self.free)} free")
        for _ in range(need):
            self.tables[seq].append(self.free.pop(0))

    def write(self, layer: int, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [g, s, d] at positions lengths[seq] .. + s (reserved beforehand)."""
        start = self.lengths[seq]
        for i in range(k.shape[1]):
            block = self.tables[seq][(start + i) // self.block_size]
            slot = (start + i) % self.block_size
            self.k[layer, block, :, slot], self.v[layer, block, :, slot] = k[:, i], v[:, i]  # [g, d]

    def read(self, layer: int, seq: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [g, tokens, d] of the first ``tokens`` positions, gathered block by block."""
        blocks = torch.tensor(self.tables[seq][: self.blocks_for(tokens)])
        k = self.k[layer, blocks].transpose(0, 1).flatten(1, 2)[:, :tokens]  # [g, blocks*bs, d] -> [g, tokens, d]
        v = self.v[layer, blocks].transpose(0, 1).flatten(1, 2)[:, :tokens]
        return k, v

    def advance(self, seq: int, tokens: int, ids=None) -> None:
        """Count ``tokens`` more as written (after every layer has written them); their ids ``ids``
        matter only to a prefix cache (``serve.prefix``)."""
        self.lengths[seq] += tokens

    def trim(self, seq: int) -> list[int]:
        """Give back the blocks past ``seq``'s written length (reserved for tokens that were then not
        kept: a speculative step's rejected drafts, ``serve.speculative``); returns them. Slots past the
        length inside its last block are simply written again by the next step."""
        keep = self.blocks_for(self.lengths[seq])
        extra = self.tables[seq][keep:]
        del self.tables[seq][keep:]
        self.free = sorted(self.free + extra)
        return extra

    def release(self, seq: int) -> None:
        """A finished sequence gives its blocks back."""
        self.free = sorted(self.free + self.tables.pop(seq))
        self.lengths.pop(seq)

    def used_blocks(self) -> int:
        return self.n_blocks - len(self.free)

    def nbytes_used(self) -> int:
        """Bytes of cache held by sequences: allocated blocks × ``block_bytes``."""
        return self.used_blocks() * self.block_bytes
