"""``playbook serve-bench``: a seeded request trace served on real ranks, reported as serving benchmarks do.

vLLM's and SGLang's serving benchmarks replay a trace of requests at a given arrival rate and
report latency distributions: time to first token, time per output token, end-to-end, at p50, p90
and p99, with throughput and the goodput under a latency target. This one does the same on a
``ParallelDims(dp, tp)`` layout of real ranks: the trace is ``theory.serving.workload.poisson_trace``
(Poisson arrivals in scheduler steps, shared-prefix groups), a router spreads it over the replicas
(``theory.serving.router``), each replica serves its share by continuous batching with, as asked, a prefix
cache and a token budget per step (``serve.batching``), and ``serve.latency`` turns each replica's
step records into the report. Every generated token is checked against the single process.

The JSON (``BENCH_KEYS`` at the top level):

- ``setup``: model, layout, seed, the trace's options, router, prefix cache, token budget, SLO (ms);
- ``measured``: ``ttft``, ``tpot``, ``itl`` (inter-token), ``e2e``, each ``{"p50", "p90", "p99"}``
  in seconds; ``duration`` (s), ``throughput_tokens_per_s``, ``slo_met`` (requests),
  ``goodput_requests_per_s``, ``requests``, ``step_seconds`` (each replica's steps, in order);
- ``predicted``: the same keys for the same schedules timed by the roofline on ``--predict-model``
  and ``--predict-hardware`` (``serve.latency.predicted_steps``, mfu 0.5, mbu 0.8), every prompt chunk
  and context ``predict_scale`` times longer (a shrunk trace replayed at its real lengths); with
  ``--quantize`` and an 8-bit ``--kv-dtype`` the roofline reads the quantized bytes (weights in one
  byte plus their scales, KV blocks with theirs), 16-bit otherwise (``setup.predicted_dtypes``);
- ``cache``: prompt tokens, tokens found cached, hit rate, evictions (over all replicas);
- ``tokens_identical``: every request's tokens equal greedy decoding without a cache (quantized:
  one process serving with the same quantized model and cache, ``serve.quant_ref``);
- ``load``: ``os.getloadavg()`` before and after (the measured times are this machine's, under it);
- ``speculative``: with ``speculative`` k > 0 (``serve.speculative``), the draft, k, acceptance rate,
  per-token α, tokens per verify and verifies (``serve.speculative.acceptance``), else None. The
  predicted latencies price each step as plain decoding would (one token per decoding request, no
  draft): speculation's own price at scale is ``theory.serving.speculative``.
"""

from __future__ import annotations

import functools
import math
import os

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.dims import ParallelDims

BENCH_KEYS = ("setup", "measured", "predicted", "cache", "tokens_identical", "load", "speculative")


def check(
    cfg: ModelConfig,
    *,
    tp,
    dp,
    requests,
    blocks,
    block_size,
    max_batch,
    token_budget,
    slo_ttft_ms,
    slo_tpot_ms,
    speculative=0,
    draft=None,
):
    """Every option, before a rank starts: one ValueError naming the constraint and a value that works."""
    from playbook.serve.checks import check_counts, check_token_budget
    from playbook.serve.drafts import check_speculative

    check_counts(requests=requests, blocks=blocks, block_size=block_size, max_batch=max_batch)
    check_token_budget(token_budget, max_batch)
    check_speculative(cfg, speculative, draft, max_batch=max_batch, token_budget=token_budget)
    for name, value in (("slo-ttft-ms", slo_ttft_ms), ("slo-tpot-ms", slo_tpot_ms)):
        if value is not None and not value > 0:
            raise ValueError(f"--{name} must be > 0 milliseconds, got {value}")
    ParallelDims(dp=dp, tp=tp).check(cfg)


# The last step a trace's request may arrive at: the scheduler runs every step until then, idle ones
# too (``serve.batching``), about a millisecond each on these ranks, so 10,000 steps are seconds.
MAX_ARRIVAL_STEP = 10_000


def check_span(trace, rate: float) -> None:
    """Refuse a trace whose last request arrives after :data:`MAX_ARRIVAL_STEP`, naming the rate
    that fits: arrival k is ⌊S_k / rate⌋ with S_k drawn independently of the rate
    (``theory.serving.workload.poisson_trace``), so rate · last / MAX_ARRIVAL_STEP brings it inside."""
    last = max(t.arrival for t in trace)
    if last <= MAX_ARRIVAL_STEP:
        return
    need = rate * last / MAX_ARRIVAL_STEP
    step = 10.0 ** (math.floor(math.log10(need)) - 1)
    need = math.ceil(need / step) * step  # two significant digits, rounded up
    raise ValueError(
        f"--rate {rate:g}: the trace's last request arrives at step {last:,}, and the scheduler runs every "
        f"step until then; a trace may span {MAX_ARRIVAL_STEP:,} steps; try --rate {need:.2g} or more"
    )


@functools.lru_cache(maxsize=4)
def _reference(cfg: ModelConfig, seed: int, requests: tuple) -> dict:
    """One process's greedy tokens without a cache, computed once per trace (a run with and one
    without a token budget check against the same)."""
    from playbook.serve.report import reference

    return reference(cfg, seed, list(requests))


def serve_bench(
    cfg: ModelConfig,
    *,
    tp: int = 1,
    dp: int = 1,
    seed: int = 0,
    requests: int = 16,
    rate: float = 0.5,
    groups: int = 2,
    prefix: int = 16,
    suffix: tuple[int, int] = (2, 12),
    new: tuple[int, int] = (4, 12),
    router: str = "prefix",
    prefix_cache: bool = True,
    token_budget: int | None = None,
    blocks: int = 64,
    block_size: int = 4,
    max_batch: int = 4,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    predict_model: str = "llama-3.1-8b",
    predict_hardware: str = "h100-sxm",
    predict_scale: int = 1,
    quantize: str | None = None,
    kv_dtype: str = "fp32",
    speculative: int = 0,
    draft: str | None = None,
    ranks=None,
    attention_dp: bool = False,
) -> dict:
    """Run the benchmark (on ``ranks``, a ``Ranks`` of tp·dp, or freshly launched ones) and report.
    ``attention_dp``: a MoE on ``dp`` DP-attention ranks, the experts over all of them, the MoE layers
    in lockstep (``serve.dp_attention``); the report adds each rank's all-to-all bytes."""
    from playbook.cluster import launch
    from playbook.serve.ranks import serve_on_rank
    from playbook.serve.batching import Request
    from playbook.serve.latency import predicted_steps, request_latencies, summarize
    from playbook.theory.serving.router import route
    from playbook.theory.serving.workload import poisson_trace

    most = prefix + suffix[1] + new[1]  # the longest request the trace can draw, before drawing it
    if most > cfg.max_seq_len:
        raise ValueError(
            f"--prefix {prefix} + --suffix up to {suffix[1]} + --new up to {new[1]} = {most} tokens, more than "
            f"{cfg.name}'s max_seq_len {cfg.max_seq_len}; e.g. --prefix 16 --suffix 2 12 --new 4 12"
        )
    check(
        cfg,
        tp=tp,
        dp=dp,
        requests=requests,
        blocks=blocks,
        block_size=block_size,
        max_batch=max_batch,
        token_budget=token_budget,
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
        speculative=speculative,
        draft=draft,
    )
    from playbook.serve import quant_ref
    from playbook.serve.checks import check_quantized

    check_quantized(cfg, quantize=quantize, kv_dtype=kv_dtype, speculative=speculative)
    big, hw = ModelConfig.preset(predict_model), Hardware.preset(predict_hardware)
    priced = dict(
        quantize=quantize, kv_dtype="bf16" if kv_dtype == "fp32" else kv_dtype
    )  # the bytes the roofline reads
    if quantize:
        from playbook.theory.serving.weights import served_weight_bytes

        served_weight_bytes(big, tp=tp, quantize=quantize, dtype="bf16")  # refuses a model it cannot count
    from playbook.serve.drafts import check_speculative

    draft = check_speculative(cfg, speculative, draft, max_batch=max_batch, token_budget=token_budget)
    if attention_dp:
        from playbook.serve.dp_attention import check_attention_dp

        check_attention_dp(cfg, tp=tp, dp=dp)
        if quantize or kv_dtype != "fp32" or speculative:
            raise ValueError(
                "--attention-dp serves full-precision weights and KV by plain decoding here; "
                "drop --quantize/--kv-dtype/--speculative, or --attention-dp"
            )
    trace = poisson_trace(
        n=requests, rate=rate, groups=groups, prefix=prefix, suffix=suffix, new=new, vocab=cfg.vocab_size, seed=seed
    )
    check_span(trace, rate)
    reqs = [Request(i, t.prompt, t.max_new, t.arrival) for i, t in enumerate(trace)]
    longest = max(-(-(len(r.prompt) + r.max_new - 1) // block_size) for r in reqs)
    if longest > blocks:
        raise ValueError(f"--blocks {blocks} cannot hold a request of {longest} blocks; use --blocks {longest}")
    where = route([r.prompt for r in reqs], dp=dp, block_size=block_size, policy=router)
    options = dict(
        cfg=cfg,
        seed=seed,
        dims=ParallelDims(dp=dp, tp=tp),
        requests=reqs,
        n_blocks=blocks,
        block_size=block_size,
        max_batch=max_batch,
        prefix_cache=prefix_cache,
        assign=where,
        token_budget=token_budget,
        quantize=quantize,
        kv_dtype=kv_dtype,
        speculative=speculative,
        draft=draft,
    )
    before = os.getloadavg()[0]
    if attention_dp:
        from playbook.serve.dp_attention import dp_attention_serve_on_rank as serve_on_rank

        options = {k: v for k, v in options.items() if k not in ("quantize", "kv_dtype", "speculative", "draft")}
    answers = ranks.run(serve_on_rank, **options) if ranks is not None else launch(serve_on_rank, tp * dp, **options)
    after = os.getloadavg()[0]
    if quant_ref.is_quantized(quantize, kv_dtype):
        keep = ("n_blocks", "block_size", "max_batch", "prefix_cache", "token_budget", "quantize", "kv_dtype")
        want = quant_ref.reference(cfg, seed, reqs, dp=dp, **{k: options[k] for k in keep + ("assign",)})
    else:
        want = _reference(cfg, seed, tuple(reqs))
    leads = [a for a in answers if a["coords"]["tp"] == 0]  # one per replica
    slo = dict(
        slo_ttft=None if slo_ttft_ms is None else slo_ttft_ms / 1e3,
        slo_tpot=None if slo_tpot_ms is None else slo_tpot_ms / 1e3,
    )
    mine = [[r for r in reqs if where[r.id] == a["coords"]["dp"]] for a in leads]
    measured = summarize([request_latencies(a["steps"], m) for a, m in zip(leads, mine)], **slo)
    measured["step_seconds"] = [[s["seconds"] for s in a["steps"]] for a in leads]
    timed = [
        predicted_steps(a["steps"], big, hw, tp=tp, dtype="bf16", mfu=0.5, mbu=0.8, scale=predict_scale, **priced)
        for a in leads
    ]
    predicted = summarize([request_latencies(s, m) for s, m in zip(timed, mine)], **slo)
    prompt_tokens = sum(len(r.prompt) for r in reqs)
    cached = sum(sum(a["cached"].values()) for a in leads)
    return {
        "setup": {
            "model": cfg.name,
            "layout": f"DP attention ×{dp}, ep{dp}" if attention_dp else f"tp{tp}×dp{dp}",
            "seed": seed,
            "trace": {
                "requests": requests,
                "rate_per_step": rate,
                "groups": groups,
                "prefix": prefix,
                "suffix": list(suffix),
                "new": list(new),
            },
            "router": router,
            "prefix_cache": prefix_cache,
            "token_budget": token_budget,
            "blocks": blocks,
            "block_size": block_size,
            "max_batch": max_batch,
            "slo_ms": {"ttft": slo_ttft_ms, "tpot": slo_tpot_ms},
            "predicted_on": f"{predict_model} on {predict_hardware}",
            "predict_scale": predict_scale,
            "quantize": quantize,
            "kv_dtype": kv_dtype,
            "predicted_dtypes": {"weights": quantize or "bf16", "kv": priced["kv_dtype"]},
        },
        "measured": measured,
        "predicted": predicted,
        "cache": {
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached,
            "hit_rate": cached / prompt_tokens,
            "evictions": sum(a["evictions"] for a in leads),
        },
        "tokens_identical": all(t == want[i][0] for a in answers for i, t in a["tokens"].items()),
        "load": {"before": before, "after": after},
        "speculative": _speculation(leads, speculative, draft),
        **_alltoall(answers, attention_dp),
    }


def _speculation(leads: list[dict], k: int, draft: str | None) -> dict | None:
    """Every replica's drafted/accepted/verify counts summed, as rates (``serve.speculative.acceptance``)."""
    if not k:
        return None
    from playbook.serve.speculative import acceptance

    counts = {key: sum(a["speculative"][key] for a in leads) for key in leads[0]["speculative"]}
    return {"k": k, "draft": draft, **acceptance(counts)}


def _alltoall(answers: list[dict], attention_dp: bool) -> dict:
    """``--attention-dp``: each rank's all-to-all bytes (measured, predicted from its routing), forwards, idle ones."""
    if not attention_dp:
        return {}
    keys = ("forwards", "idle_forwards")
    return {"alltoall_bytes": [a["alltoall_bytes"] | {k: a[k] for k in keys} for a in answers]}


def summary(report: dict) -> str:
    """The report as lines: setup, one row per metric (ms), throughput, goodput, cache, load."""
    s, m, p = report["setup"], report["measured"], report["predicted"]
    lines = [
        f"serve-bench {s['model']} {s['layout']}: {m['requests']} requests, router {s['router']}, prefix cache "
        f"{s['prefix_cache']}, token budget {s['token_budget']}; tokens identical: {report['tokens_identical']}"
        + (
            f"; weights {s['quantize'] or 'fp32'}, KV {s['kv_dtype']}"
            if s.get("quantize") or s.get("kv_dtype", "fp32") != "fp32"
            else ""
        ),
        f"{'ms':<6}{'p50':>9}{'p90':>9}{'p99':>9}   predicted on {s['predicted_on']}: p50, p99",
    ]
    for k in ("ttft", "tpot", "itl", "e2e"):
        lines.append(
            f"{k:<6}"
            + "".join(f"{m[k][q] * 1e3:>9.1f}" for q in ("p50", "p90", "p99"))
            + f"   {p[k]['p50'] * 1e3:.2f}, {p[k]['p99'] * 1e3:.2f}"
        )
    c = report["cache"]
    lines += [
        f"throughput {m['throughput_tokens_per_s']:.0f} tokens/s; goodput {m['goodput_requests_per_s']:.2f} "
        f"requests/s ({m['slo_met']} of {m['requests']} met SLO {s['slo_ms']} ms)",
        f"cache: {c['cached_tokens']} of {c['prompt_tokens']} prompt tokens found ({c['hit_rate']:.0%}), "
        f"{c['evictions']} evictions; load {report['load']['before']:.1f} -> {report['load']['after']:.1f}",
    ]
    sp = report.get("speculative")
    if sp:
        lines.append(
            f"speculative k={sp['k']} draft {sp['draft']}: acceptance rate {sp['acceptance_rate']:.0%} "
            f"(per-token α {sp['alpha']:.2f}), {sp['tokens_per_verify']:.2f} tokens per verify over {sp['verifies']} verifies"
        )
    for r, a in enumerate(report.get("alltoall_bytes", [])):
        lines.append(
            f"rank {r}: all-to-all bytes predicted from routing {a['predicted']:,.0f}, measured {a['measured']:,.0f}; "
            f"{a['idle_forwards']} idle forwards"
        )
    return "\n".join(lines)
