"""``playbook serve-plan`` for a mixture of experts: TP attention against DP attention, the experts over
every GPU (``theory.serving.moe_layouts``), printed after the tp × dp table; ``--attention-dp`` reports
the DP-attention layout against the best."""

from __future__ import annotations

from playbook.cli.checks import BadInput


def moe_rows(cfg, hw, args) -> tuple[list[dict], str | None]:
    """(rows, why none): every attention tp of ``--gpus`` with the experts over all of them. A dense
    model or ``--gpus`` not dividing the experts: no rows and the reason, or (``--attention-dp``) one line."""
    from playbook.theory.serving.moe_layouts import check_moe_layout, compare_moe_layouts

    try:
        check_moe_layout(cfg, gpus=args.gpus, attention_tp=1)
    except ValueError as e:
        if getattr(args, "attention_dp", False):
            raise BadInput(f"--attention-dp: {e}") from None
        return [], str(e)
    from playbook.theory.serving.serving import BY_SIZE, RING_STEP

    options = dict(mem_util=args.mem_util, block_size=args.block_size, dtype=args.dtype)
    latency = BY_SIZE if getattr(args, "allreduce", "ring") == "by-size" else RING_STEP
    rows = compare_moe_layouts(cfg, hw, gpus=args.gpus, context=args.context, latency=latency, **options)
    if getattr(args, "attention_dp", False) and not rows[0]["fits"]:
        raise BadInput(
            f"--attention-dp: {cfg.name}'s weights ({rows[0]['weights_per_gpu'] / 1e9:.1f} GB per GPU under DP attention) "
            f"leave no room for one {args.context}-token sequence on {args.hardware}; try more --gpus or --dtype fp8"
        )
    return rows, None


def moe_json(rows: list[dict], args) -> dict:
    from playbook.theory.serving.moe_layouts import recommend_moe

    if not rows:
        return {}
    best, why = recommend_moe(rows) if any(r["fits"] for r in rows) else ({"layout": None}, "none fits")
    out = {"moe_layouts": rows, "moe_recommended": best["layout"], "moe_why": why}
    if getattr(args, "attention_dp", False):
        out["attention_dp"] = next(r for r in rows if r["attention_tp"] == 1)
    return out


def print_moe(rows: list[dict], args, reason: str | None) -> None:
    """The MoE table: weights, KV room and its replicated share per GPU, sequences, step, tokens/s."""
    from playbook.theory.serving.moe_layouts import recommend_moe

    if not rows:
        if reason and "dense model" not in reason:
            print(f"MoE layouts (experts over all {args.gpus} GPUs): {reason}")
        return
    print(
        f"MoE layouts, experts over all {args.gpus} GPUs (ep{args.gpus}); attention split over tp ranks, "
        "each group of them serving its own requests (DP attention: tp1)"
    )
    print(
        f"  {'layout':<17} {'weights/GPU':>11} {'KV/GPU':>8} {'copies':>7} {'seqs':>6} {'TPOT':>8} "
        f"{'all-to-all':>10} {'tokens/s':>9}"
    )
    for r in rows:
        tail = (
            f"{r['tpot'] * 1e3:>6.1f}ms {r['alltoall_bytes_per_step'] / 1e6:>7.1f} MB {r['tokens_per_s']:>9,.0f}"
            if r["fits"]
            else f"{'does not fit one sequence':>36}"
        )
        share = r["replicated_kv_per_gpu"] / r["kv_per_gpu"] if r["kv_per_gpu"] else 0.0
        print(
            f"  {r['layout']:<17} {r['weights_per_gpu'] / 1e9:>8.1f} GB {r['kv_per_gpu'] / 1e9:>5.1f} GB {share:>7.0%} "
            f"{r['seqs']:>6} {tail}"
        )
    print(
        "  copies: share of the KV room holding KV another rank also holds (KV heads replicated past n_kv_heads, "
        "an MLA latent on every TP rank); all-to-all: bytes per GPU per decode step"
    )
    if not any(r["fits"] for r in rows):
        return
    best, why = recommend_moe(rows)
    print(f"MoE recommended: {best['layout']}: {why}")
    if getattr(args, "attention_dp", False):
        dp = next(r for r in rows if r["attention_tp"] == 1)
        against = (
            "the best here" if dp is best else f"{dp['tokens_per_s'] / best['tokens_per_s']:.0%} of {best['layout']}'s"
        )
        print(f"--attention-dp: {dp['seqs']:,} sequences, {dp['tokens_per_s']:,.0f} tokens/s ({against})")
