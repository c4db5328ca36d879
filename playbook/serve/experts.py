"""Expert-parallel greedy decoding on real ranks: a MoE model's experts split over ``ep`` ranks.

The ranks form ``ParallelDims(dp=n, ep=n)``: every rank holds the dense weights (attention, router,
embedding, head) and E/n experts of each MoE layer, and decodes its own rows of the prompts (row i on
rank i mod n) with a contiguous KV cache (``serve.generate.greedy``). The model is built exactly as
the hybrid mesh builds it (``parallel.hybrid.parallelize.parallelize``: ``ExpertParallelMoE`` over the mesh's
``ep`` group, counts over ``dp_cp``), with no capacity limit, so no token is dropped and each
token meets the same experts as in one process (DeepSpeed-MoE inference, Rajbhandari et al. 2022,
arXiv:2201.05596, §5). Every forward of every MoE layer costs each rank one all-gather of the
routed counts and two all-to-alls (dispatch, combine; GShard, Lepikhin et al. 2020,
arXiv:2006.16668); the ranks decode in lockstep because every rank must join them.

Checked against the single process (``tests/serve/test_serve_pp_ep.py``): tokens equal greedy decoding of
``model.gpt.build_moe(cfg, seed)`` without a cache, logits within 1e-5; the all-to-all bytes each rank sent
while decoding equal ``theory.serving.parallel.ep_forward_alltoall_bytes`` of the routing counts
every MoE layer saw at every step.
"""

from __future__ import annotations

import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.serve.generate import greedy
from playbook.theory.serving.parallel import ep_forward_alltoall_bytes


def check(cfg: ModelConfig, *, ep: int, rows: int) -> None:
    """One ``ValueError`` naming the broken constraint and what works, before any rank starts."""
    ParallelDims(dp=ep, ep=ep).check(cfg)
    if rows % ep:
        raise ValueError(f"{rows} prompt rows do not split over ep={ep} ranks; use a multiple of {ep} rows")


def build(ctx, cfg: ModelConfig, seed: int, ep: int):
    """The single-process MoE model (no capacity limit) with its experts split over this rank's ep group."""
    from playbook.model.gpt import build_moe
    from playbook.theory.hybrid.plan import Plan
    from playbook.parallel.hybrid.parallelize import parallelize

    dims = ParallelDims(dp=ep, ep=ep)
    mesh = ctx.mesh_for(dims)
    model = parallelize(build_moe(cfg, seed, capacity_factor=None).eval(), mesh, Plan(dims))
    return model, mesh


def _in(windows, t: float) -> bool:
    return any(s <= t <= e for s, e in windows)


@torch.no_grad()
def expert_decode_on_rank(ctx, *, cfg: ModelConfig, seed: int, ep: int, prompts: torch.Tensor, new_tokens: int) -> dict:
    """Greedy-decode this rank's rows of ``prompts`` [R, p] (row i on rank i mod ep) with the experts
    split over ``ep`` ranks. Returns its tokens and logits, the all-to-all and counts all-gather bytes
    it sent while decoding, the routing counts of every decode forward of every MoE layer, and the
    decode seconds."""
    from playbook.model.moe import moe_layers

    model, mesh = build(ctx, cfg, seed, ep)
    me = mesh.index("dp_cp")
    rows = [i for i in range(prompts.shape[0]) if i % ep == me]
    routing: list[list] = []  # per forward call of each layer, in call order: counts_by_rank [n][E]
    hooks = [
        m.register_forward_hook(lambda mod, i, o: routing.append(mod.stats.counts_by_rank)) for m in moe_layers(model)
    ]
    try:
        out = greedy(model, prompts[rows], new_tokens)
    finally:
        for h in hooks:
            h.remove()
    spans = ctx.tracer.spans
    decode = [(s.start, s.end) for s in spans if s.kind == "compute" and s.name.startswith("decode ")]
    sent: dict[str, float] = {}
    for s in spans:
        if s.kind == "comm" and _in(decode, s.start):
            sent[s.name] = sent.get(s.name, 0.0) + s.sent_bytes
    n_layers = len(moe_layers(model))
    return {
        "rank": ctx.rank,
        "ep_rank": mesh.index("ep"),
        "rows": rows,
        "tokens": out.tokens,
        "logits": out.logits,
        "decoded": len(rows) * (new_tokens - 1),
        "sent_while_decoding": sent,
        "decode_routing": routing[n_layers:],  # the prefill's forward first, one entry per layer
        "decode_seconds": sum(out.step_seconds),
    }


def predicted_alltoall_bytes(routing: list[list[list[int]]], ep: int, hidden: int) -> list[float]:
    """Per rank: bytes sent in all-to-alls over these forwards (each a counts_by_rank [n][E])."""
    total = [0.0] * len(routing[0]) if routing else []
    for counts in routing:
        for r, b in enumerate(ep_forward_alltoall_bytes(counts, ep, hidden)):
            total[r] += b
    return total


def merge(answers: list[dict], cfg: ModelConfig, *, ep: int, want) -> dict:
    """Every rank's rows against the reference ``want`` = (tokens [R, new], logits [R, new, V]):
    token agreement, worst logit difference, all-to-all bytes per decoded token measured and
    predicted from the routing counts (and under even routing), counts all-gather bytes, tokens/s."""
    from playbook.theory.serving.parallel import ep_counts_bytes_per_forward, ep_uniform_bytes_per_token

    answers = sorted(answers, key=lambda a: a["ep_rank"])
    tokens, logits = want
    steps = tokens.shape[1] - 1
    predicted = predicted_alltoall_bytes(answers[0]["decode_routing"], ep, cfg.hidden)
    per = [max(a["decoded"], 1) for a in answers]
    decoded = sum(a["decoded"] for a in answers)
    seconds = max(a["decode_seconds"] for a in answers)
    return {
        "tokens_identical": all(torch.equal(a["tokens"], tokens[a["rows"]]) for a in answers),
        "max_abs_logit_diff": max(float((a["logits"] - logits[a["rows"]]).abs().max()) for a in answers),
        "alltoall_bytes_per_token": {
            "predicted": [b / n for b, n in zip(predicted, per)],
            "measured": [a["sent_while_decoding"].get("all_to_all_single", 0.0) / n for a, n in zip(answers, per)],
            "even_routing": ep_uniform_bytes_per_token(cfg, ep=ep),
        },
        "counts_bytes_per_step": {
            "predicted": ep_counts_bytes_per_forward(cfg, ep=ep),
            "measured": [a["sent_while_decoding"].get("all_gather_single", 0.0) / max(steps, 1) for a in answers],
        },
        "decoded": decoded,
        "decode_seconds": seconds,
        "tokens_per_second": decoded / seconds if seconds else 0.0,
    }


def serve_ep(
    cfg: ModelConfig,
    *,
    ep: int,
    seed: int = 0,
    rows: int = 4,
    prompt_len: int = 8,
    new_tokens: int = 12,
    ranks=None,
    launch=None,
) -> dict:
    """Decode ``rows`` random prompts with the experts split over ``ep`` ranks (``ranks``: a started
    ``Ranks`` of ep processes, or fresh ones started by ``launch``, default ``cluster.launch``) and compare with the single-process MoE model.
    Returns ``merge``'s dict with the load average."""
    import os

    from playbook.cluster import launch as fresh
    from playbook.model.gpt import build_moe
    from playbook.serve.generate import greedy_without_cache

    check(cfg, ep=ep, rows=rows)
    if prompt_len + new_tokens - 1 > cfg.max_seq_len:
        raise ValueError(f"prompt {prompt_len} + {new_tokens} new tokens exceed max_seq_len={cfg.max_seq_len}")
    prompts = torch.randint(0, cfg.vocab_size, (rows, prompt_len), generator=torch.Generator().manual_seed(seed))
    kw = dict(cfg=cfg, seed=seed, ep=ep, prompts=prompts, new_tokens=new_tokens)
    answers = (
        ranks.run(expert_decode_on_rank, **kw)
        if ranks is not None
        else (launch or fresh)(expert_decode_on_rank, ep, **kw)
    )
    want = greedy_without_cache(build_moe(cfg, seed, capacity_factor=None).eval(), prompts, new_tokens)
    return {"ep": ep, **merge(answers, cfg, ep=ep, want=want), "load_average": os.getloadavg()[0]}
