"""Prefix caching in the paged KV cache: requests that start with the same tokens share their blocks.

Many requests begin alike: a system prompt shared by every user of an application, or a
conversation whose next turn repeats every earlier one. Their keys and values at those positions
are the same (a token's K and V depend only on the tokens up to it), so a block computed once can
serve them all and its tokens skip prefill. This is vLLM's *automatic prefix caching* (RFC
vllm-project/vllm#2614, January 2024, and vLLM's design document "Automatic Prefix Caching"; the
PagedAttention paper, Kwon et al. 2023, §4.4, shares only prefixes a provider reserves in advance):

- a block, once full, is keyed by a hash of every token from the start of the sequence to its end
  (chained: the key of block k hashes the key of block k − 1 with block k's tokens), so equal keys
  mean equal prefixes, not merely equal blocks;
- a new request looks its prompt up block by block and takes the longest run of keys found; the
  last prompt token is always recomputed (its logits give the first new token);
- each block counts the sequences that hold it; when the count falls to zero a keyed block is not
  freed but kept in a least-recently-used list, still findable; a new block is taken from the never
  keyed free blocks first, then by evicting the least recently freed keyed block.

A sequence releases its blocks last-first, so a prompt's tail is evicted before its head, which
more requests share. SGLang (Zheng et al. 2024, "SGLang: Efficient Execution of Structured Language
Model Programs", §3, RadixAttention) keeps the same blocks in a radix tree of token sequences
instead of a hash table: a lookup walks the tree, eviction takes least-recently-used leaves, and
a router can ask a tree how much of a prompt it holds. With its default page of one token it matches
a prefix token by token, where this cache (and vLLM) matches whole blocks only: two prompts sharing
1,030 tokens reuse 1,024 of them in blocks of 16 (chapter 7, §4b).

``theory.serving.prefix_cache.ReferencePrefixCache`` is the brute-force model this one is tested against.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from playbook.serve.kv import PagedKVCache


def block_key(parent: bytes, tokens) -> bytes:
    """The key of a full block: sha256 of its parent block's key and its own token ids."""
    return hashlib.sha256(parent + b"|" + ",".join(map(str, tokens)).encode()).digest()


class PrefixKVCache(PagedKVCache):
    """A ``PagedKVCache`` whose full blocks are shared between sequences with the same prefix."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.refs = [0] * self.n_blocks  # sequences holding each physical block
        self.key_of: dict[int, bytes] = {}  # physical block -> key (full, registered blocks)
        self.block_of: dict[bytes, int] = {}  # key -> physical block
        self.lru: OrderedDict[int, None] = OrderedDict()  # keyed blocks nobody holds, oldest first
        self.tokens: dict[int, list[int]] = {}  # sequence -> token ids written
        self.keys: dict[int, list[bytes]] = {}  # sequence -> key of each of its full blocks
        self.hit_tokens: dict[int, int] = {}  # sequence -> prompt tokens found in the cache
        self.evictions = 0
        self.log: list[tuple] = []  # every call, for replay against the reference

    def match(self, prompt) -> list[int]:
        """Physical blocks holding the longest cached block-aligned prefix of ``prompt`` (the last
        prompt token excluded: it must be computed for its logits)."""
        blocks, parent = [], b""
        for k in range((len(prompt) - 1) // self.block_size):
            parent = block_key(parent, prompt[k * self.block_size : (k + 1) * self.block_size])
            if parent not in self.block_of:
                break
            blocks.append(self.block_of[parent])
        return blocks

    def evictable_hits(self, prompt) -> int:
        """How many of ``prompt``'s cached blocks sit in the LRU list (taking them leaves fewer to evict)."""
        return sum(b in self.lru for b in self.match(prompt))

    def available(self) -> int:
        """Blocks a new allocation can take: never-keyed free ones and keyed ones nobody holds."""
        return len(self.free) + len(self.lru)

    def add(self, seq: int, prompt=()) -> int:
        """Start ``seq`` with its cached prefix in its block table; returns the tokens found."""
        super().add(seq)
        self.log.append(("add", seq, tuple(prompt)))
        hit = self.match(prompt)
        for b in hit:
            self.refs[b] += 1
            self.lru.pop(b, None)
        n = len(hit) * self.block_size
        self.tables[seq], self.lengths[seq] = list(hit), n
        self.tokens[seq] = list(prompt[:n])
        self.keys[seq] = [self.key_of[b] for b in hit]
        self.hit_tokens[seq] = n
        return n

    def _take(self) -> int:
        if self.free:
            b = self.free.pop(0)
        else:
            b, _ = self.lru.popitem(last=False)  # the least recently freed keyed block
            del self.block_of[self.key_of.pop(b)]
            self.evictions += 1
        self.refs[b] = 1
        return b

    def reserve(self, seq: int, tokens: int) -> None:
        self.log.append(("reserve", seq, tokens))
        need = self.blocks_for(self.lengths[seq] + tokens) - len(self.tables[seq])
        if need > self.available():
            raise RuntimeError(f"KV cache full: sequence {seq} needs {need} more block(s), {self.available()} free")
        for _ in range(need):
            self.tables[seq].append(self._take())

    def advance(self, seq: int, tokens: int, ids=None) -> None:
        """Count ``tokens`` more as written, their ids ``ids``; every block this fills is keyed (unless
        another block already holds that prefix: then this one stays private)."""
        if ids is None or len(ids) != tokens:
            raise ValueError(f"a prefix cache needs the ids of the {tokens} token(s) written to sequence {seq}")
        self.log.append(("advance", seq, tuple(ids)))
        super().advance(seq, tokens)
        self.tokens[seq].extend(ids)
        bs, keys = self.block_size, self.keys[seq]
        while (len(keys) + 1) * bs <= self.lengths[seq]:
            k = len(keys)
            keys.append(block_key(keys[-1] if keys else b"", self.tokens[seq][k * bs : (k + 1) * bs]))
            b = self.tables[seq][k]
            if keys[-1] not in self.block_of and b not in self.key_of:
                self.block_of[keys[-1]], self.key_of[b] = b, keys[-1]

    def trim(self, seq: int) -> list[int]:
        """Give back the blocks past ``seq``'s length (never keyed: only full written blocks are)."""
        self.log.append(("trim", seq))
        keep = self.blocks_for(self.lengths[seq])
        extra = self.tables[seq][keep:]
        del self.tables[seq][keep:]
        for b in extra:
            self.refs[b] -= 1
            self.free.append(b)
        self.free.sort()
        return extra

    def release(self, seq: int) -> None:
        """``seq`` lets go of its blocks, last first: keyed ones nobody holds join the LRU list's end,
        the others go back to the free list."""
        self.log.append(("release", seq))
        for b in reversed(self.tables.pop(seq)):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self.key_of:
                    self.lru[b] = None
                else:
                    self.free.append(b)
        self.free.sort()
        for d in (self.lengths, self.tokens, self.keys):
            d.pop(seq)

    def used_blocks(self) -> int:
        """Blocks some running sequence holds (each counted once, however many share it)."""
        return self.n_blocks - self.available()
