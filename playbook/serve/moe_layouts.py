"""MoE serving on n real ranks, two layouts with the experts over all n: TP attention and DP attention.

- **TP attention** (``serve.moe_tp``): one replica; heads split over the n ranks (KV heads
  replicated when n exceeds them), every request on every rank, the experts' outputs summed by
  an all-reduce: two all-reduces of [B, 1, h] per layer per decode step.
- **DP attention** (``serve.experts``, DeepSeek-V3, arXiv:2412.19437, §3.4.2; SGLang's DP attention):
  each rank holds the whole attention and decodes its own requests (row i on rank i mod n) with their
  whole KV; every MoE layer dispatches each token's k rows to the experts' ranks and combines them back
  (two all-to-alls per layer per step, plus the all-gather of routed counts).

Both greedy-decode the same prompts with a contiguous KV cache (``serve.generate.greedy``) in one
call of the ranks; checked against the single process (``model.gpt.build_moe``, no cache): tokens
identical, logits within 1e-5; the KV bytes each rank holds against
``theory.serving.moe_layouts.kv_per_token_per_gpu``; the bytes each rank sends per decode step
(tracer, inside the "decode k" spans) against ``allreduce_bytes_per_step`` (TP attention) and
the routing counts' all-to-all rows (DP attention, ``theory.serving.parallel.ep_forward_alltoall_bytes``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.parallel.report import Report
from playbook.serve.experts import build as build_dp, predicted_alltoall_bytes
from playbook.serve.generate import greedy
from playbook.theory.serving.moe_layouts import (
    LAYOUTS,
    allreduce_bytes_per_step,
    alltoall_bytes_per_step,
    check_moe_layout,
    kv_per_token_per_gpu,
)
from playbook.theory.serving.parallel import ep_counts_bytes_per_forward

ACT_BYTES = 4  # fp32 on these ranks


def check(cfg: ModelConfig, *, ep: int, rows: int, prompt_len: int, new_tokens: int) -> None:
    """One ``ValueError`` naming the constraint and what works, before any rank starts."""
    if ep < 2:
        raise ValueError(f"--attention-dp splits the experts over --ep ranks, got --ep {ep}; try --ep 2")
    check_moe_layout(cfg, gpus=ep, attention_tp=ep)  # dense model, ep not dividing experts/heads, KV heads
    if rows < ep:
        raise ValueError(
            f"--requests {rows} leave DP-attention ranks idle (each of the ep={ep} decodes its own); use --requests {ep}"
        )
    if prompt_len + new_tokens - 1 > cfg.max_seq_len:
        raise ValueError(f"prompt {prompt_len} + {new_tokens} new tokens exceed max_seq_len={cfg.max_seq_len}")


def _decode_sent(spans) -> dict[str, float]:
    """Bytes this rank sent per collective inside the "decode k" compute spans of ``spans``."""
    windows = [(s.start, s.end) for s in spans if s.kind == "compute" and s.name.startswith("decode ")]
    sent: dict[str, float] = {}
    for s in spans:
        if s.kind == "comm" and any(a <= s.start <= b for a, b in windows):
            sent[s.name] = sent.get(s.name, 0.0) + s.sent_bytes
    return sent


@torch.no_grad()
def layouts_on_rank(ctx, *, cfg: ModelConfig, seed: int, ep: int, prompts: torch.Tensor, new_tokens: int) -> dict:
    """Decode ``prompts`` [R, p] under TP attention (every row here), then under DP attention (rows
    i mod ep == this rank): per layout its rows, tokens, logits, KV bytes held, bytes sent per
    collective while decoding, the DP layout's routing counts of every decode forward, decode seconds."""
    from playbook.model.gpt import build_moe
    from playbook.model.moe import moe_layers
    from playbook.serve.moe_tp import TPAttentionMoE

    out = {"rank": ctx.rank}
    mesh = ctx.mesh_for(ParallelDims(tp=ep))
    model = TPAttentionMoE(build_moe(cfg, seed, capacity_factor=None).eval(), mesh.group("tp"), mesh.index("tp"), ep)
    for layout in ("tp", "dp"):
        routing: list = []
        if layout == "dp":
            model, dp_mesh = build_dp(ctx, cfg, seed, ep)
            rows = [i for i in range(prompts.shape[0]) if i % ep == dp_mesh.index("dp_cp")]
            hooks = [
                m.register_forward_hook(lambda mod, i, o: routing.append(mod.stats.counts_by_rank))
                for m in moe_layers(model)
            ]
        else:
            rows, hooks = list(range(prompts.shape[0])), []
        first = len(ctx.tracer.spans)
        try:
            gen = greedy(model, prompts[rows], new_tokens)
        finally:
            for h in hooks:
                h.remove()
        out[layout] = {
            "rows": rows,
            "tokens": gen.tokens,
            "logits": gen.logits,
            "kv_bytes": gen.kv_bytes,
            "sent": _decode_sent(ctx.tracer.spans[first:]),
            "decode_routing": routing[cfg.n_moe_layers :],  # the prefill's forward first, one per layer
            "decode_seconds": sum(gen.step_seconds),
        }
    return out


def merge(answers: list[dict], cfg: ModelConfig, *, ep: int, prompt_len: int, new_tokens: int, want) -> list[dict]:
    """One row per layout: parity against ``want`` = (tokens [R, new], logits [R, new, V]), KV bytes
    per rank measured and predicted (and the replicated share), bytes per decode step per rank by
    collective measured and predicted, tokens/s."""
    tokens, logits = want
    steps, cached = new_tokens - 1, prompt_len + new_tokens - 1  # tokens in the cache at the end
    out = []
    for layout, t in (("tp", ep), ("dp", 1)):
        runs = [a[layout] for a in answers]
        kv = kv_per_token_per_gpu(cfg, attention_tp=t, dtype="fp32")
        batch = [len(r["rows"]) for r in runs]  # requests on each rank (DP attention: i mod ep, maybe uneven)
        if layout == "tp":
            predicted = {
                "all_reduce": [allreduce_bytes_per_step(cfg, tokens=b, tp=ep, act_bytes=ACT_BYTES) for b in batch]
            }
        else:
            routed = predicted_alltoall_bytes(runs[0]["decode_routing"], ep, cfg.hidden)
            predicted = {
                "all_to_all_single": [b / steps for b in routed],
                "all_gather_single": [ep_counts_bytes_per_forward(cfg, ep=ep)] * ep,
            }
        seconds = max(r["decode_seconds"] for r in runs)
        row = {
            "layout": LAYOUTS[layout],
            "attention_tp": t,
            "rows_per_rank": batch,  # [ep]
            "tokens_identical": all(torch.equal(r["tokens"], tokens[r["rows"]]) for r in runs),
            "max_abs_logit_diff": max(float((r["logits"] - logits[r["rows"]]).abs().max()) for r in runs),
            "kv_bytes": {
                "measured": [r["kv_bytes"] for r in runs],
                "predicted": [b * cached * kv["held"] for b in batch],
                "replicated": [b * cached * kv["replicated"] for b in batch],
            },
            "bytes_per_step": {
                name: {"measured": [r["sent"].get(name, 0.0) / steps for r in runs], "predicted": p}
                for name, p in predicted.items()
            },
            "tokens_per_second": len(tokens) * steps / seconds,
        }
        if layout == "dp":
            row["alltoall_even_routing"] = [
                alltoall_bytes_per_step(cfg, tokens_per_rank=b, gpus=ep, act_bytes=ACT_BYTES) for b in batch
            ]
        out.append(row)
    return out


def problem(rows: list[dict]) -> str | None:
    """Why a layout failed parity (tokens, logits, KV bytes, bytes per step), or None."""
    for r in rows:
        if not r["tokens_identical"]:
            return f"{r['layout']}: tokens differ from the single process"
        if not r["max_abs_logit_diff"] <= 1e-5:
            return f"{r['layout']}: logits differ by {r['max_abs_logit_diff']:.2e} (> 1e-5)"
        if r["kv_bytes"]["measured"] != r["kv_bytes"]["predicted"]:
            return f"{r['layout']}: KV bytes {r['kv_bytes']['measured']} != predicted {r['kv_bytes']['predicted']}"
        for name, b in r["bytes_per_step"].items():
            if any(abs(m - p) > 1e-6 * max(1.0, p) for m, p in zip(b["measured"], b["predicted"])):
                return f"{r['layout']}: {name} bytes per step {b['measured']} != predicted {b['predicted']}"
    return None


def serve_moe_layouts(
    cfg: ModelConfig,
    *,
    ep: int,
    seed: int = 0,
    rows: int = 4,
    prompt_len: int = 8,
    new_tokens: int = 8,
    ranks=None,
    launch=None,
) -> dict:
    """Both layouts on ``ep`` ranks (a started ``Ranks``, or fresh ones from ``launch``, default
    ``cluster.launch``) against one process: ``{"ep", "rows", "layouts": merge's rows, "load_average"}``."""
    from playbook.cluster import launch as fresh
    from playbook.model.gpt import build_moe
    from playbook.serve.generate import greedy_without_cache

    check(cfg, ep=ep, rows=rows, prompt_len=prompt_len, new_tokens=new_tokens)
    prompts = torch.randint(0, cfg.vocab_size, (rows, prompt_len), generator=torch.Generator().manual_seed(seed))
    kw = dict(cfg=cfg, seed=seed, ep=ep, prompts=prompts, new_tokens=new_tokens)
    answers = ranks.run(layouts_on_rank, **kw) if ranks is not None else (launch or fresh)(layouts_on_rank, ep, **kw)
    want = greedy_without_cache(build_moe(cfg, seed, capacity_factor=None).eval(), prompts, new_tokens)
    layouts = merge(answers, cfg, ep=ep, prompt_len=prompt_len, new_tokens=new_tokens, want=want)
    return {"ep": ep, "rows": rows, "layouts": layouts, "load_average": os.getloadavg()[0]}


def _nums(xs) -> str:
    return ", ".join(f"{x:,.0f}" for x in xs)


@dataclass
class MoELayoutsReport(Report):
    """``playbook run serve --attention-dp --ep N``: both layouts against one process."""

    result: dict

    def problem(self) -> str | None:
        return problem(self.result["layouts"])

    def summary(self) -> str:
        r = self.result
        lines = [
            f"MoE serving on {r['ep']} rank(s), experts over all of them, {r['rows']} requests "
            f"(load average {r['load_average']:.1f})"
        ]
        for row in r["layouts"]:
            kv = row["kv_bytes"]
            lines += [
                f"  {row['layout']} (attention tp{row['attention_tp']}, requests per rank {_nums(row['rows_per_rank'])}): "
                f"tokens identical to one process: {row['tokens_identical']}, max |logit diff| {row['max_abs_logit_diff']:.1e}",
                f"    KV bytes per rank: predicted {_nums(kv['predicted'])}, measured {_nums(kv['measured'])} "
                f"(replicated {_nums(kv['replicated'])})",
            ]
            for name, b in row["bytes_per_step"].items():
                lines.append(
                    f"    {name} bytes per decode step per rank: predicted {_nums(b['predicted'])}, "
                    f"measured {_nums(b['measured'])}"
                )
            if "alltoall_even_routing" in row:
                lines.append(f"    (even routing would send {_nums(row['alltoall_even_routing'])})")
        if self.problem():
            lines.append(f"  PARITY FAILED: {self.problem()}")
        return "\n".join(lines)
