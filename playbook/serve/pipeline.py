"""Pipeline-parallel greedy decoding on real ranks: the GPT's layers cut into ``pp`` stages.

Stage i of a ``ParallelDims(pp=P)`` mesh holds layers [i·L/P, (i+1)·L/P) and, for each
micro-batch, a KV cache of those layers only; the first stage also holds the embedding, the last
the final norm and the head (GPipe's cut, Huang et al. 2019, arXiv:1811.06965; at inference, Pope
et al. 2022, arXiv:2211.05102, §3.3). The prompts' rows are cut into ``microbatches`` groups, and
every step each group goes through the stages in turn:

    first stage: embed its tokens (the prompt, then the id the last stage sent back)
    every stage: its layers over the new tokens, with its cache; send [rows, s, h] to the next
    last stage:  head, argmax; send the ids [rows] back to the first stage

Sends are ``isend`` (never block), receives block; each stage handles (step, micro-batch) in the
same order, so every receive meets its send and nothing waits in a cycle. While stage 1 works on
micro-batch 0, stage 0 works on micro-batch 1: with m ≥ pp micro-batches in flight no stage waits
but at the start and the end (``theory.serving.parallel.pp_decode_bubble``). Peers are addressed by
``Mesh.global_rank("pp", i)``.

Checked against the single process (``tests/serve/test_serve_pp_ep.py``): tokens equal greedy decoding of
the reference GPT without a cache, logits within 1e-5; bytes each stage sends per decoded token
equal ``pp_stage_bytes_per_token`` (4·h from every stage but the last, an 8-byte id from the last).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.serve.generate import attend, contiguous_store
from playbook.serve.kv import KVCache
from playbook.theory.hybrid.stages import stage_layers as all_stage_layers


def stage_layers(n_layers: int, pp: int, stage: int) -> range:
    """The layers of ``stage`` when ``n_layers`` are cut into ``pp`` stages (``theory.hybrid.stages``)."""
    return all_stage_layers(n_layers, pp)[stage]


def check(cfg: ModelConfig, *, pp: int, rows: int, microbatches: int, prompt_len: int, new_tokens: int) -> None:
    """One ``ValueError`` naming the broken constraint and what works, before any rank starts."""
    ParallelDims(pp=pp).check(cfg)
    if cfg.n_layers % pp:
        ok = [k for k in range(1, cfg.n_layers + 1) if cfg.n_layers % k == 0]
        raise ValueError(f"pp={pp} must divide n_layers={cfg.n_layers} (equal stages); try pp in {ok}")
    if not 1 <= microbatches <= rows:
        raise ValueError(f"microbatches={microbatches} must be in 1..{rows} (the rows of the prompts)")
    if new_tokens < 1 or prompt_len + new_tokens - 1 > cfg.max_seq_len:
        raise ValueError(
            f"prompt {prompt_len} + {new_tokens} new tokens must fit max_seq_len={cfg.max_seq_len}; "
            f"generate 1..{cfg.max_seq_len - prompt_len + 1} tokens"
        )


def _span(ctx, name: str):
    return ctx.tracer.span(name)


@torch.no_grad()
def pipeline_decode_on_rank(
    ctx, *, cfg: ModelConfig, seed: int, pp: int, prompts: torch.Tensor, new_tokens: int, microbatches: int
) -> dict:
    """This rank's stage of greedy decoding of ``prompts`` [R, p] over ``pp`` stages with
    ``microbatches`` groups of rows in flight. Returns the tokens [R, new] and (last stage) logits
    [R, new, V], the bytes it sent while decoding by dtype, and its compute spans."""
    mesh = ctx.mesh_for(ParallelDims(pp=pp))
    stage, group = mesh.index("pp"), mesh.group("pp")
    first, last = stage == 0, stage == pp - 1
    nxt = mesh.global_rank("pp", (stage + 1) % pp)
    prv = mesh.global_rank("pp", (stage - 1) % pp)
    model = GPT(cfg, seed=seed).eval()
    blocks = [model.blocks[i] for i in stage_layers(cfg.n_layers, pp, stage)]
    R, p = prompts.shape
    groups = list(torch.arange(R).tensor_split(microbatches))  # rows of each micro-batch
    caches = [KVCache(len(blocks), len(rows)) for rows in groups]
    tokens = torch.zeros(R, new_tokens, dtype=torch.long)
    logits = torch.zeros(R, new_tokens, cfg.vocab_size) if last else None
    pending: list = []  # (work, tensor): isends in flight, their buffers kept alive until waited on

    def send(t: torch.Tensor, dst: int) -> None:
        t = t.contiguous()
        pending.append((dist.isend(t, dst, group=group), t))

    def recv(shape, dtype, src: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype)
        dist.recv(buf, src, group=group)
        return buf

    decode_from = 0
    for step in range(new_tokens):  # step 0: prefill (the prompt), then one token per row
        s, start = (p, 0) if step == 0 else (1, p + step - 1)
        if step == 1:
            decode_from = len(ctx.tracer.spans)
        for j, rows in enumerate(groups):
            n = len(rows)
            if first:
                if step == 0:
                    ids = prompts[rows]  # [n, p]
                elif pp == 1:
                    ids = tokens[rows, step - 1][:, None]  # [n, 1]
                else:
                    ids = recv((n,), torch.long, prv)[:, None]  # [n, 1] from the last stage
            else:
                x = recv((n, s, cfg.hidden), torch.float32, prv)  # [n, s, h]
            with _span(ctx, f"{'prefill' if step == 0 else f'decode {step - 1}'} mb{j}"):
                if first:
                    x = model.embed(ids)  # [n, s, h]
                for local, block in enumerate(blocks):
                    x = x + attend(block.attn, block.attn_norm(x), [start] * n, contiguous_store(caches[j], local))
                    x = x + block.mlp(block.mlp_norm(x))  # [n, s, h]
                if last:
                    out = model.head(x)[:, -1]  # [n, V]
                    logits[rows, step], tokens[rows, step] = out, out.argmax(-1)
            if not last:
                send(x, nxt)  # [n, s, h] to the next stage
            elif pp > 1 and step < new_tokens - 1:
                send(tokens[rows, step], nxt)  # [n] ids back to the first stage
    for work, _ in pending:
        work.wait()
    # per decoded token: the activations sent while decoding, and every id sent back (each one is
    # the input of a decode step: the prefill's token feeds decode step 0)
    sends = [(i, sp) for i, sp in enumerate(ctx.tracer.spans) if sp.kind == "comm" and sp.name == "isend"]
    sent = {
        "activations": sum(sp.sent_bytes for i, sp in sends if sp.dtype == "torch.float32" and i >= decode_from > 0),
        "token_ids": sum(sp.sent_bytes for _, sp in sends if sp.dtype == "torch.int64"),
    }
    return {
        "rank": ctx.rank,
        "stage": stage,
        "tokens": tokens if last else None,
        "logits": logits,
        "decoded": R * (new_tokens - 1),
        "sent_while_decoding": sent,
        "units": [(sp.name, sp.start, sp.end) for sp in ctx.tracer.spans if sp.kind == "compute"],
    }


def timeline(answers: list[dict], phase: str = "decode") -> dict:
    """From every stage's compute spans of ``phase``: wall seconds from the first start to the last
    end, each stage's busy seconds, and the measured idle / total."""
    units = [(a["stage"], s, e) for a in answers for name, s, e in a["units"] if name.startswith(phase + " ")]
    if not units:
        return {"seconds": 0.0, "busy": [], "bubble": 0.0}
    t0, t1 = min(u[1] for u in units), max(u[2] for u in units)
    stages = sorted({u[0] for u in units})
    busy = [sum(e - s for st, s, e in units if st == k) for k in stages]
    wall = t1 - t0
    return {"seconds": wall, "busy": busy, "bubble": 1.0 - sum(busy) / len(busy) / wall if wall else 0.0}


def merge(answers: list[dict], cfg: ModelConfig, *, pp: int, microbatches: int, want) -> dict:
    """Every stage's result against the reference ``want`` = (tokens [R, new], logits [R, new, V]):
    token agreement, worst logit difference, bytes per decoded token per stage measured and
    predicted, and the decode timeline (tokens/s, bubble measured beside the ideal)."""
    from playbook.theory.serving.parallel import pp_decode_bubble, pp_stage_bytes_per_token

    answers = sorted(answers, key=lambda a: a["stage"])
    out = answers[-1]
    tokens, logits = want
    steps = tokens.shape[1] - 1
    decoded = out["decoded"]
    times = timeline(answers)
    return {
        "tokens_identical": bool(torch.equal(out["tokens"], tokens)),
        "max_abs_logit_diff": float((out["logits"] - logits).abs().max()),
        "bytes_per_token": {
            "predicted": pp_stage_bytes_per_token(cfg, pp=pp),
            "measured": [sum(a["sent_while_decoding"].values()) / max(decoded, 1) for a in answers],
        },
        "decoded": decoded,
        "decode_seconds": times["seconds"],
        "tokens_per_second": decoded / times["seconds"] if times["seconds"] else 0.0,
        "bubble": {
            "predicted": pp_decode_bubble(pp, microbatches, steps) if steps else 0.0,
            "measured": times["bubble"],
        },
    }


def serve_pp(
    cfg: ModelConfig,
    *,
    pp: int,
    seed: int = 0,
    rows: int = 4,
    prompt_len: int = 8,
    new_tokens: int = 12,
    microbatches: int | None = None,
    ranks=None,
    launch=None,
) -> dict:
    """Decode ``rows`` random prompts on ``pp`` stages (on ``ranks``, a started ``Ranks`` of pp
    processes, or fresh ones started by ``launch``, default ``cluster.launch``) and compare with the reference GPT in this process; ``microbatches``
    defaults to pp (every stage busy). Returns ``merge``'s dict with the load average."""
    import os

    from playbook.cluster import launch as fresh
    from playbook.serve.generate import greedy_without_cache

    m = microbatches or pp
    check(cfg, pp=pp, rows=rows, microbatches=m, prompt_len=prompt_len, new_tokens=new_tokens)
    prompts = torch.randint(0, cfg.vocab_size, (rows, prompt_len), generator=torch.Generator().manual_seed(seed))
    kw = dict(cfg=cfg, seed=seed, pp=pp, prompts=prompts, new_tokens=new_tokens, microbatches=m)
    answers = (
        ranks.run(pipeline_decode_on_rank, **kw)
        if ranks is not None
        else (launch or fresh)(pipeline_decode_on_rank, pp, **kw)
    )
    want = greedy_without_cache(GPT(cfg, seed=seed).eval(), prompts, new_tokens)
    return {
        "pp": pp,
        "microbatches": m,
        **merge(answers, cfg, pp=pp, microbatches=m, want=want),
        "load_average": os.getloadavg()[0],
    }
