"""Prefix caching, brute force: which prompt tokens a block cache with LRU eviction finds (pure Python).

The model that ``serve.prefix.PrefixKVCache`` is held to, written as plainly as possible: no hashes
and no physical block ids. The cache is a list of resident blocks, each named by the whole token
prefix it ends (a tuple, compared by equality), with the number of sequences holding it and, once
none does, the time it was let go. Looking up a prompt looks each block-aligned prefix up in turn; taking a block uses a never-cached one while any is left, else evicts the resident
block let go longest ago (vLLM's automatic prefix caching: RFC vllm-project/vllm#2614, January 2024,
and vLLM's design document "Automatic Prefix Caching"). The last prompt token is never taken from the
cache. ``block_size=1`` matches token by token, as SGLang's radix tree does with its default page of one.

``simulate`` replays a request trace through it with whole requests served one after another
(arrival order, all tokens at once): the hit rate and prefill tokens saved a replica of a given
number of blocks would see, which is how the chapter predicts them at scale.
"""

from __future__ import annotations

from playbook.hardware import MEM_UTIL


class ReferencePrefixCache:
    """``n_blocks`` blocks of ``block_size`` tokens; the same calls as ``PrefixKVCache``."""

    def __init__(self, n_blocks: int, block_size: int):
        self.n_blocks, self.block_size = n_blocks, block_size
        self.resident: list[dict] = []  # {"prefix": tuple, "refs": int, "freed": int | None}
        self.index: dict[tuple, dict] = {}  # the same records by prefix, so a lookup is not a scan
        self.seqs: dict[int, dict] = {}  # seq -> {"tokens": list, "blocks": [record or None (private)], ...}
        self.clock = 0
        self.evictions = 0

    def _find(self, prefix: tuple):
        return self.index.get(prefix)

    def private_blocks(self) -> int:
        return sum(b is None for s in self.seqs.values() for b in s["blocks"])

    def in_use(self) -> int:
        """Blocks some sequence holds, shared ones once."""
        return sum(r["refs"] > 0 for r in self.resident) + self.private_blocks()

    def add(self, seq: int, prompt) -> int:
        bs, prompt = self.block_size, tuple(prompt)
        found = []
        for k in range((len(prompt) - 1) // bs):
            r = self._find(prompt[: (k + 1) * bs])
            if r is None:
                break
            found.append(r)
        for r in found:
            r["refs"] += 1
            r["freed"] = None
        n = len(found) * bs
        self.seqs[seq] = {"tokens": list(prompt[:n]), "blocks": found, "length": n, "settled": len(found)}
        return n

    def reserve(self, seq: int, tokens: int) -> None:
        s = self.seqs[seq]
        need = -(-(s["length"] + tokens) // self.block_size) - len(s["blocks"])
        room = self.n_blocks - self.in_use()  # never cached, or cached and held by nobody
        if need > room:
            raise RuntimeError(f"KV cache full: sequence {seq} needs {need} more block(s), {room} free")
        for _ in range(need):
            fresh = self.n_blocks - len(self.resident) - self.private_blocks()
            if fresh == 0:
                idle = [r for r in self.resident if r["refs"] == 0]
                victim = min(idle, key=lambda r: r["freed"])
                self.resident.remove(victim)
                del self.index[victim["prefix"]]
                self.evictions += 1
            s["blocks"].append(None)

    def advance(self, seq: int, ids) -> None:
        s, bs = self.seqs[seq], self.block_size
        s["tokens"].extend(ids)
        s["length"] += len(ids)
        while (s["settled"] + 1) * bs <= s["length"]:  # a block just filled: cache it, once
            k = s["settled"]
            s["settled"] += 1
            prefix = tuple(s["tokens"][: (k + 1) * bs])
            if s["blocks"][k] is None and self._find(prefix) is None:  # else another block holds it
                s["blocks"][k] = {"prefix": prefix, "refs": 1, "freed": None}
                self.resident.append(s["blocks"][k])
                self.index[prefix] = s["blocks"][k]

    def release(self, seq: int) -> None:
        for b in reversed(self.seqs.pop(seq)["blocks"]):
            if b is not None:
                b["refs"] -= 1
                if b["refs"] == 0:
                    b["freed"] = self.clock
                    self.clock += 1

    def trim(self, seq: int) -> None:
        """Drop the (private) blocks past the sequence's length: a speculative step's rejected tokens."""
        s = self.seqs[seq]
        del s["blocks"][-(-s["length"] // self.block_size) :]

    def replay(self, log) -> list:
        """Apply a ``PrefixKVCache.log``; returns the tokens found by each ``add``, in order."""
        hits = []
        for op, seq, *arg in log:
            if op == "add":
                hits.append(self.add(seq, arg[0]))
            elif op == "reserve":
                self.reserve(seq, arg[0])
            elif op == "advance":
                self.advance(seq, arg[0])
            elif op == "trim":
                self.trim(seq)
            else:
                self.release(seq)
        return hits


def simulate(requests, *, n_blocks: int, block_size: int) -> dict:
    """Serve ``requests`` (each ``(prompt, max_new)``) one at a time through a reference cache of
    ``n_blocks``: prompt tokens found, prefill tokens computed, evictions. The generated tokens'
    ids are not known without a model: a stand-in id (−1 − position) fills their blocks, which
    no later prompt matches, so only prompts are reused (as in a trace of conversations whose
    answers are part of the next prompt only if the trace says so)."""
    cache, found, prompt_tokens = ReferencePrefixCache(n_blocks, block_size), 0, 0
    for i, (prompt, new) in enumerate(requests):
        hit = cache.add(i, prompt)
        rest = len(prompt) - hit + new - 1
        cache.reserve(i, rest)
        cache.advance(i, list(prompt[hit:]) + [-1 - j for j in range(new - 1)])
        cache.release(i)
        found += hit
        prompt_tokens += len(prompt)
    return {
        "prompt_tokens": prompt_tokens,
        "cached_tokens": found,
        "prefill_tokens": prompt_tokens - found,
        "hit_rate": found / prompt_tokens if prompt_tokens else 0.0,
        "evictions": cache.evictions,
    }


def prefix_layouts(
    cfg,
    hw,
    trace,
    *,
    gpus: int,
    tps,
    context: int,
    block_size: int = 16,
    router: str = "prefix",
    mem_util: float = MEM_UTIL,
    dtype: str = "bf16",
    kv_scale: float = 1.0,
) -> list[dict]:
    """For each tp in ``tps`` (dp = gpus / tp): the KV blocks a replica holds (``theory.serving.serving.kv_capacity``
    × ``kv_scale``, the budget knob), the trace routed over the replicas (``theory.serving.router.route``)
    and replayed through each replica's cache (``simulate``): hit rate, prefill tokens saved, and
    the roofline's prefill time of the uncached tokens (median over requests, no queueing: TTFT
    when the replica is free) beside what it would be without a cache."""
    from playbook.theory.serving.router import route  # pure Python
    from playbook.theory.serving import serving

    rows = []
    for tp in tps:
        dp = gpus // tp
        cap = serving.kv_capacity(
            cfg, hw, context=context, tp=tp, mem_util=mem_util, block_size=block_size, dtype=dtype
        )
        blocks = int(cap["blocks"] * kv_scale)
        where = route([t.prompt for t in trace], dp=dp, block_size=block_size, policy=router)
        sims, uncached = [], []
        for r in range(dp):
            mine = [t for t, w in zip(trace, where) if w == r]
            cache, found = ReferencePrefixCache(blocks, block_size), []
            for i, t in enumerate(mine):
                hit = cache.add(i, t.prompt)
                cache.reserve(i, len(t.prompt) - hit + t.max_new - 1)
                cache.advance(i, list(t.prompt[hit:]) + [-1 - j for j in range(t.max_new - 1)])
                cache.release(i)
                found.append(hit)
                uncached.append(len(t.prompt) - hit)
            sims.append((sum(found), sum(len(t.prompt) for t in mine), cache.evictions))

        def ttft(tokens):
            ts = sorted(serving.prefill(cfg, hw, prompt=max(n, 1), tp=tp, dtype=dtype).seconds for n in tokens)
            return ts[len(ts) // 2]

        cached, total = sum(s[0] for s in sims), sum(s[1] for s in sims)
        rows.append(
            {
                "layout": f"tp{tp}×dp{dp}",
                "tp": tp,
                "dp": dp,
                "blocks_per_replica": blocks,
                "hit_rate": cached / total,
                "prefill_tokens_saved": cached,
                "prompt_tokens": total,
                "evictions": sum(s[2] for s in sims),
                "ttft_p50": ttft(uncached),
                "ttft_p50_no_cache": ttft([len(t.prompt) for t in trace]),
            }
        )
    return rows
