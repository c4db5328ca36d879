"""What ``playbook run serve`` checks before any rank starts (its ``check`` hook and ``run_serve``)."""

from __future__ import annotations

from dataclasses import replace

from playbook.dims import ParallelDims
from playbook.serve.batching import make_requests

KV_TOKENS_PER_RANK = 1 << 20  # the most tokens a rank's paged pool may hold here (a CPU process)


def check_counts(**counts: int) -> None:
    """``--requests``, ``--blocks``, ``--block-size``, ``--max-batch``: each a positive integer."""
    for name, value in counts.items():
        if value < 1:
            flag = name.replace("_", "-")
            raise ValueError(f"--{flag} must be a positive integer, got {value}; try --{flag} 4")


def check_token_budget(token_budget: int | None, max_batch: int) -> None:
    """``--token-budget``: none, or a positive integer above ``--max-batch`` (``run serve``, ``serve-bench``)."""
    if token_budget is None:
        return
    check_counts(token_budget=token_budget)
    if token_budget <= max_batch:  # every running request decodes one token a step
        raise ValueError(
            f"--token-budget {token_budget} must exceed --max-batch {max_batch} (every running request decodes "
            f"one token per step, the rest goes to prefill); try --token-budget {max_batch + 8}"
        )


def check_serve(
    setup,
    world_size,
    tp: int,
    dp: int,
    requests: int,
    blocks: int,
    block_size: int,
    max_batch: int,
    *,
    router: str = "round-robin",
    token_budget: int | None = None,
    shared_prefix: int = 0,
    speculative: int = 0,
    draft: str | None = None,
):
    """(dims, cfg, requests) of a dp × tp serving run, or one ``ValueError`` before any rank starts."""
    from playbook.theory.serving.router import POLICIES

    if router not in POLICIES:
        raise ValueError(f"--router {router} is not one of {', '.join(POLICIES)}; try --router prefix")
    check_token_budget(token_budget, max_batch)
    dims = ParallelDims(dp=dp, tp=tp)
    if world_size and world_size != dims.world:
        raise ValueError(
            f"--world-size {world_size} but --tp {tp} --dp {dp} need {dims.world} ranks; omit --world-size"
        )
    check_counts(requests=requests, blocks=blocks, block_size=block_size, max_batch=max_batch)
    cfg = setup.config()
    dims.check(cfg)
    from playbook.serve.drafts import check_speculative

    check_speculative(cfg, speculative, draft, max_batch=max_batch, token_budget=token_budget)
    new = (2, min(10, cfg.max_seq_len // 4))
    reqs = make_requests(requests, cfg.vocab_size, seed=setup.seed, new=new)
    if shared_prefix:  # one system prompt before every request's own tokens: what a prefix cache finds
        if shared_prefix < 0 or shared_prefix + 12 + new[1] > cfg.max_seq_len:
            most = cfg.max_seq_len - 12 - new[1]
            raise ValueError(
                f"--shared-prefix {shared_prefix} must be in 0..{most} ({cfg.name} holds {cfg.max_seq_len} tokens "
                f"per sequence, a request up to 12 of its own + {new[1]} new); try --shared-prefix {min(8, most)}"
            )
        system = tuple(make_requests(1, cfg.vocab_size, seed=setup.seed + 1, prompt=(shared_prefix,) * 2)[0].prompt)
        reqs = [replace(r, prompt=system + r.prompt) for r in reqs]
    longest = max(len(r.prompt) + r.max_new - 1 for r in reqs)
    need = -(-longest // block_size)
    if need > blocks:
        raise ValueError(
            f"--blocks {blocks} of {block_size} tokens cannot hold a request of {longest} tokens; "
            f"use --blocks {need} or more"
        )
    if blocks * block_size > KV_TOKENS_PER_RANK:
        raise ValueError(
            f"--blocks {blocks} × --block-size {block_size} = {blocks * block_size:,} tokens of KV per rank is more "
            f"than a rank here holds ({KV_TOKENS_PER_RANK:,}); these requests need --blocks {need} of {block_size} "
            f"tokens, e.g. --blocks {max(need, 16)}"
        )
    return dims, cfg, reqs


def check_options(args) -> None:
    """``playbook run serve``'s constraints, before the memory check and any rank."""
    from playbook.parallel.training import TrainSetup

    o = vars(args)
    setup = TrainSetup(model=args.model, steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len)
    check_quantized(
        setup.config(),
        quantize=o.get("quantize"),
        kv_dtype=o.get("kv_dtype", "fp32"),
        pp=o["pp"],
        ep=o["ep"],
        speculative=o.get("speculative", 0),
    )
    if o.get("attention_dp"):
        from playbook.serve.moe_layouts import check

        _check_attention_dp(o.get("world_size"), tp=o["tp"], dp=o["dp"], pp=o["pp"], ep=o["ep"])
        check(setup.config(), ep=o["ep"], rows=o["requests"], prompt_len=8, new_tokens=8)
        return
    if o["pp"] > 1 or o["ep"] > 1:
        if o.get("speculative") or o.get("draft"):
            raise ValueError("--speculative decodes on TP shards in DP replicas here, not with --pp or --ep; drop one")
        _check_alone(o.get("world_size"), tp=o["tp"], dp=o["dp"], pp=o["pp"], ep=o["ep"])
        return
    check_serve(
        setup,
        o.get("world_size"),
        o["tp"],
        o["dp"],
        o["requests"],
        o["blocks"],
        o["block_size"],
        o["max_batch"],
        router=o.get("router", "round-robin"),
        token_budget=o.get("token_budget"),
        shared_prefix=o.get("shared_prefix", 0),
        speculative=o.get("speculative") or 0,
        draft=o.get("draft"),
    )


def check_quantized(cfg, *, quantize, kv_dtype: str = "fp32", pp: int = 1, ep: int = 1, speculative: int = 0) -> None:
    """``--quantize`` and ``--kv-dtype``: known formats, on TP × DP serving of a dense model, not
    with ``--speculative`` (the one place both ``run serve`` and ``serve-bench`` refuse the pair)."""
    from playbook.serve.kv_quant import check_kv_dtype
    from playbook.theory.serving.weights import QUANTIZE

    if quantize is not None and quantize not in QUANTIZE:
        raise ValueError(f"--quantize {quantize} is not one of {', '.join(QUANTIZE)}; try --quantize int8")
    check_kv_dtype(kv_dtype)
    if quantize is None and kv_dtype == "fp32":
        return
    if speculative and (quantize or kv_dtype in ("int8", "fp8")):
        raise ValueError(
            "--speculative runs with full-precision weights and a 16/32-bit KV cache here (a rolled-back 8-bit "
            "block would keep the scales of rejected tokens); drop --quantize/--kv-dtype or --speculative"
        )
    flags = " ".join(
        f for f in (quantize and f"--quantize {quantize}", kv_dtype != "fp32" and f"--kv-dtype {kv_dtype}") if f
    )
    if pp > 1 or ep > 1:
        raise ValueError(f"{flags} serves TP × DP layouts, not --pp/--ep; try {flags} --tp 2")
    if quantize and cfg.is_moe:
        raise ValueError(f"--quantize {quantize} covers dense models, not {cfg.name}; try --model gpt-tiny")


def _check_attention_dp(world_size, *, tp: int, dp: int, pp: int, ep: int) -> None:
    """``--attention-dp``: the layouts over ``--ep N`` ranks, no other degree."""
    if tp > 1 or dp > 1 or pp > 1:
        raise ValueError(
            f"--attention-dp compares both attention layouts on the --ep ranks itself (got tp={tp}, dp={dp}, pp={pp}); "
            f"give only --ep, e.g. --attention-dp --ep 2 --model gpt-tiny-moe"
        )
    if ep < 2:
        raise ValueError("--attention-dp splits the experts over --ep ranks; add --ep 2 (and an MoE --model)")
    if world_size and world_size != ep:
        raise ValueError(f"--world-size {world_size} but --attention-dp --ep {ep} needs {ep} ranks; omit --world-size")


def _check_alone(world_size, *, tp: int, dp: int, pp: int, ep: int) -> int:
    if (pp > 1) + (ep > 1) + (tp > 1) + (dp > 1) > 1:
        raise ValueError(
            f"--pp and --ep run alone here (got tp={tp}, dp={dp}, pp={pp}, ep={ep}); e.g. --pp 2 or --ep 2"
        )
    degree = max(pp, ep)
    if world_size and world_size != degree:
        raise ValueError(f"--world-size {world_size} but --{'pp' if pp > 1 else 'ep'} {degree} needs {degree} ranks")
    return degree


def serving_bytes(cfg, *, tp: int, dp: int, blocks: int, block_size: int) -> tuple[float, float]:
    """(bytes per rank, bytes in all) of a dp × tp serving run here, before it starts: every rank
    builds the whole fp32 reference GPT and slices its tp shard from it (``serve.ranks.build``), and
    holds a paged KV pool of ``blocks × block_size`` fp32 tokens of its KV heads; the parent process
    builds one more reference to check the tokens against (``serve.report.reference``)."""
    from playbook.theory.serving.serving import kv_bytes_per_token

    weights = 4.0 * cfg.num_params()
    per_rank = weights * (1 + (1 / tp if tp > 1 else 0))
    per_rank += blocks * block_size * kv_bytes_per_token(cfg, tp=tp, dtype="fp32")
    return per_rank, dp * tp * per_rank + weights
