"""Continuous batching over a paged KV cache: requests join and leave between decode steps.

Static batching waits for a whole batch, then runs it until its longest request ends. Iteration-level
scheduling (Yu et al. 2022, "Orca", OSDI) decides *every step*: requests that arrived are admitted
(their prompt prefilled, which yields their first token), every running request decodes one token
in one batched step, and a request that has its tokens leaves at once, its place taken at the next
step. With a paged cache (Kwon et al. 2023, vLLM, §4) the sequences of a batch can have any length:
each grows its own block table one block at a time and frees every block when it ends.

Admission here is conservative: a request is admitted only if the blocks that all running requests
could still need, plus its own worst case (prompt + max new tokens), fit in the pool, so no running
request ever has to be preempted (vLLM instead admits optimistically and preempts, §4.5). The
per-sequence work of a step (RoPE at each one's positions, attention over its own blocks) is a
loop over sequences; the projections, the MLP and TP's all-reduces are batched over every token.

With ``prefix_cache=True`` the pool is a ``serve.prefix.PrefixKVCache``: an admitted request starts
with the blocks of its longest cached prefix and prefills only the rest; admission then counts the
blocks still to take against the free and evictable ones.

Without a budget a step prefills every admitted prompt whole, so the decodes of that step wait for
it: a long prompt stalls every running request's next token. Sarathi-Serve (Agrawal et al. 2024,
"Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI, §4) bounds the
tokens of a step: each running request's decode token first, then prompt chunks up to the budget,
a prompt taking several steps; its KV is written chunk by chunk and only its last chunk's logits
give its first token. As in Sarathi-Serve (§4) a step is *one* forward over its mixed tokens,
prompt chunks and decode tokens packed back to back (``serve.packed``), each sequence attending at
its own positions over its own blocks; so is a step without a budget (whole prompts and decodes).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from playbook.cluster.trace import tracer as trace
from playbook.serve.kv_quant import make_cache
from playbook.serve.packed import forward_packed
from playbook.theory.serving.serving import kv_block_bytes, kv_bytes_per_token


@dataclass(frozen=True)
class Request:
    """A prompt (token ids), how many tokens to generate, and the scheduler step it arrives at."""

    id: int
    prompt: tuple[int, ...]
    max_new: int
    arrival: int = 0


def make_requests(
    n: int,
    vocab: int,
    *,
    seed: int = 0,
    prompt: tuple[int, int] = (3, 12),
    new: tuple[int, int] = (2, 10),
    every: int = 1,
) -> list[Request]:
    """``n`` requests with random prompt lengths and token counts in the given [low, high] ranges,
    one arriving every ``every`` steps (request i at step i·every), drawn from ``seed`` alone."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(prompt[0], prompt[1] + 1, (), generator=gen))
        m = int(torch.randint(new[0], new[1] + 1, (), generator=gen))
        out.append(Request(i, tuple(torch.randint(0, vocab, (p,), generator=gen).tolist()), m, i * every))
    return out


@dataclass
class BatchRun:
    """Tokens and their logits per request, and one record per scheduler step."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    logits: dict[int, torch.Tensor] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    cached: dict[int, int] = field(default_factory=dict)  # prompt tokens found in a prefix cache

    def hit_rate(self, requests: list[Request]) -> float:
        """Prompt tokens found in the cache over all prompt tokens."""
        return sum(self.cached.values()) / max(sum(len(r.prompt) for r in requests), 1)


class ContinuousBatcher:
    """Serves requests with ``model`` (a ``GPT`` or a ``TPGPT`` shard) over a ``PagedKVCache`` of
    ``n_blocks`` blocks of ``block_size`` tokens, at most ``max_batch`` requests at a time; with
    ``theory.serving.prefix_cache``, blocks of equal prefixes are shared (``serve.prefix``); with ``token_budget``,
    a step computes at most that many tokens, decodes first, prompts in chunks (chunked prefill);
    ``kv_dtype``: the cache's storage, 8-bit ones with per-block scales (``serve.kv_quant``)."""

    def __init__(
        self,
        model,
        *,
        n_blocks: int,
        block_size: int = 4,
        max_batch: int = 8,
        prefix_cache: bool = False,
        token_budget: int | None = None,
        kv_dtype: str = "fp32",
    ):
        if token_budget is not None and token_budget <= max_batch:
            raise ValueError(
                f"token_budget={token_budget} must exceed max_batch={max_batch} (every running request decodes "
                f"one token per step, the rest of the budget goes to prefill); try token_budget={max_batch + 8}"
            )
        self.token_budget = token_budget
        attn = model.blocks[0].attn
        self.model, self.max_batch, self.prefix = model, max_batch, prefix_cache
        self.cache = make_cache(
            kv_dtype,
            prefix=prefix_cache,
            n_layers=len(model.blocks),
            kv_heads=attn.kv_heads,
            head_dim=attn.head_dim,
            n_blocks=n_blocks,
            block_size=block_size,
        )
        tp = dist.get_world_size(model.group) if getattr(model, "group", None) is not None else 1
        self.kv_dtype = kv_dtype
        self.kv_per_token = kv_bytes_per_token(model.cfg, tp=tp, dtype=kv_dtype)  # this rank's share, predicted
        self.block_predicted = kv_block_bytes(model.cfg, tp=tp, dtype=kv_dtype, block_size=block_size)  # with scales

    def _store(self, ids: list[int], starts: list[int], cache=None):
        cache = self.cache if cache is None else cache  # another pool: a speculative draft's (``serve.speculative``)

        def store_for(layer):
            def store(row, k, v):
                cache.write(layer, ids[row], k, v)  # k, v: [g, s, d]
                return cache.read(layer, ids[row], starts[row] + k.shape[1])  # [g, n, d]

            return store

        return store_for

    def _forward(self, ids: list[int], chunks: list[list[int]]) -> torch.Tensor:
        """New tokens ``chunks[i]`` of sequences ``ids``, in one forward -> each one's last logits [n, V];
        the cache of each grows by its chunk."""
        starts = [self.cache.lengths[i] for i in ids]
        for i, chunk in zip(ids, chunks):
            self.cache.reserve(i, len(chunk))
        logits = forward_packed(self.model, chunks, starts, self._store(ids, starts))  # [n, V]
        for i, chunk in zip(ids, chunks):
            self.cache.advance(i, len(chunk), chunk)
        return logits

    def _fits(self, r: Request, running: dict, need: dict) -> bool:
        """Admitting ``r`` leaves room for every running request's worst case and its own."""
        if not self.prefix:
            return sum(need[i] for i in running) + need[r.id] <= self.cache.n_blocks
        c = self.cache
        future = sum(need[i] - len(c.tables[i]) for i in running)  # blocks the running ones may still take
        hits = c.match(r.prompt)
        return future + need[r.id] - len(hits) <= c.available() - sum(b in c.lru for b in hits)

    def _emit(self, run: BatchRun, ids: list[int], logits: torch.Tensor) -> None:
        for i, row in zip(ids, logits):
            run.tokens[i].append(int(row.argmax()))
            run.logits[i] = torch.cat([run.logits[i], row[None]]) if i in run.logits else row[None]

    def _decode_tokens(self, run: BatchRun, running: dict, decoding: list[int]) -> int:
        """Tokens the decoding requests take from a step's budget: one each (``serve.speculative``: k + 1)."""
        return len(decoding)

    def _compute(self, run: BatchRun, running: dict, prefilled: dict, decoding: list[int], pending: dict) -> list[int]:
        """One forward over the prompt chunks ``prefilled`` and one token of each ``decoding`` request;
        returns the requests that got a token (a prompt's last chunk gives its first)."""
        ids = [*prefilled, *decoding]
        chunks = [*prefilled.values(), *([run.tokens[i][-1]] for i in decoding)]
        logits = self._forward(ids, chunks)  # [n, V]
        done = [j for j, i in enumerate(ids) if not pending.get(i)]  # decoding, or its whole prompt in
        emitted = [ids[j] for j in done]
        self._emit(run, emitted, logits[done])
        return emitted

    def _record(self) -> dict:
        """More of a step's record (``serve.speculative``: drafted and accepted tokens)."""
        return {}

    @torch.no_grad()
    def run(self, requests: list[Request]) -> BatchRun:
        """Serve every request to completion; ``BatchRun.steps[k]``: what happened at step k."""
        need = {r.id: self.cache.blocks_for(len(r.prompt) + r.max_new - 1) for r in requests}
        if max(need.values(), default=0) > self.cache.n_blocks:
            worst = max(requests, key=lambda r: need[r.id])
            raise ValueError(
                f"request {worst.id} needs {need[worst.id]} blocks of {self.cache.block_size} tokens "
                f"but the cache has {self.cache.n_blocks}; use n_blocks >= {need[worst.id]}"
            )
        waiting = sorted(requests, key=lambda r: (r.arrival, r.id))
        running: dict[int, Request] = {}
        pending: dict[int, list[int]] = {}  # admitted requests' prompt tokens not yet computed
        run, step, tracer = BatchRun(), 0, trace.current()
        while waiting or running:
            t0, c0 = time.perf_counter(), time.thread_time()
            decoding = [i for i in running if i not in pending]  # prompt done at an earlier step: one token each
            admitted, prefilled, emitted = [], {}, []
            while (
                waiting
                and waiting[0].arrival <= step
                and len(running) < self.max_batch
                and self._fits(waiting[0], running, need)
            ):
                r = waiting.pop(0)
                running[r.id], run.tokens[r.id] = r, []
                if self.prefix:
                    hit = self.cache.add(r.id, r.prompt)  # tokens of its prompt already cached
                else:
                    hit = 0
                    self.cache.add(r.id)
                run.cached[r.id], pending[r.id] = hit, list(r.prompt[hit:])
                admitted.append(r.id)
            budget = self.token_budget - self._decode_tokens(run, running, decoding) if self.token_budget else None
            for i in list(pending):  # prefills, oldest first: whole, or chunks within the step's budget
                if budget is not None and budget <= 0:
                    break
                chunk = pending[i] if budget is None else pending[i][:budget]
                pending[i] = pending[i][len(chunk) :]
                budget = None if budget is None else budget - len(chunk)
                prefilled[i] = chunk
            if prefilled or decoding:  # one forward: the prompt chunks, then every decoding request's tokens
                with tracer.span(f"step {step}") if tracer else nullcontext():
                    emitted = self._compute(run, running, prefilled, decoding, pending)
                prefilled = {i: len(c) for i, c in prefilled.items()}
                for i in emitted:
                    pending.pop(i, None)
            finished = [i for i, r in running.items() if len(run.tokens[i]) == r.max_new]
            tables = {i: list(self.cache.tables[i]) for i in running}
            lengths = {i: self.cache.lengths[i] for i in running}
            held = self.cache.nbytes_used()  # measured: blocks off the free list × bytes of a block
            for i in finished:
                running.pop(i)
                self.cache.release(i)
            run.steps.append(
                {
                    "step": step,
                    "admitted": admitted,
                    "decoded": decoding,
                    "finished": finished,
                    "tables": tables,
                    "lengths": lengths,
                    "free_blocks_after": len(self.cache.free),
                    "kv_bytes": held,
                    "kv_predicted": None  # shared blocks: counted by theory.prefix_cache instead
                    if self.prefix
                    else sum(self.cache.blocks_for(n) for n in lengths.values()) * self.block_predicted,
                    "prefilled": prefilled,  # request -> prompt tokens computed this step
                    "prefill_tokens": sum(prefilled.values()),
                    "emitted": emitted,  # requests that got a token this step
                    "seconds": time.perf_counter() - t0,
                    "cpu_seconds": time.thread_time() - c0,  # this thread's own: what shared cores don't inflate
                    **self._record(),
                }
            )
            step += 1
        return run
