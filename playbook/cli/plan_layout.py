"""``playbook plan --layout``: cost one given layout (``theory.plan.layout``) and print it."""

from __future__ import annotations

import json

from playbook.cli.checks import BadInput

# what a layout label says, printed under every answer and in --help
LABEL_KEY = (
    "a label reads dp8×tp8×pp16 (the degrees; cp, ep when > 1) z1 (ZeRO stage) b1 (micro-batch, sequences) "
    "m32 (micro-batches per step) none (recomputation: none, selective, full), then the schedule and v (chunks per rank)"
)


def one_layout(cfg, hw, args, options: dict, life: dict | None = None) -> int:
    """``--layout``: cost one given layout (``theory.plan.layout``) and print it, or its JSON;
    ``options``: the flags' gpus_per_node, mem_util, activations, overlap, precision and mesh_order."""
    from playbook.theory.plan.layout import cost_layout, parse_layout

    lay = parse_layout(args.layout, global_batch=args.global_batch)
    if lay.dp * lay.tp * lay.pp * lay.cp != args.gpus:
        raise BadInput(
            f"--layout uses dp·tp·pp·cp = {lay.dp * lay.tp * lay.pp * lay.cp} GPUs but --gpus is {args.gpus}; "
            f"try --gpus {lay.dp * lay.tp * lay.pp * lay.cp}"
        )
    r = cost_layout(cfg, hw, lay, seq_len=args.seq_len, **options)
    if args.json:
        print(json.dumps(r if life is None else {**r, "life": life}, indent=2))
        return 0
    print(
        f"{cfg.name}, {r['layout']} on {r['gpus']} × {args.hardware}, seq {args.seq_len}, "
        f"{args.activations} activations, overlap {args.overlap}, {args.precision}"
    )
    if r["rope_scaling"]:
        print(f"  ({r['rope_scaling']})")
    mem = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in r["memory_bytes"].items())
    verdict = "fits" if r["fits"] else "does NOT fit"
    print(
        f"  memory/GPU: {r['memory_total'] / 1e9:.1f} GB ({mem}); {verdict}, margin "
        f"{r['margin_bytes'] / 1e9:+.1f} GB of {args.mem_util:g} × {hw.capacity_bytes / 1e9:.1f} GB"
    )
    step = r["step"]
    axes = ", ".join(f"{a} {d['exposed']:.2f}" for a, d in step["axes"].items())
    print(
        f"  step: {step['total']:.2f} s = compute {step['compute']:.2f} + bubble {step['bubble']:.2f} "
        f"+ exposed {step['exposed_comm']:.2f} ({axes or 'none'})"
    )
    if "unranked" in r:  # too many units to search (theory.plan.search.MAX_UNITS)
        ranks = f"not ranked against a search ({r['unranked']})"
    else:
        ranks = (
            f"rank {r['rank']} of the {r['of']} layouts that fit, {r['rank_recompute']} of the {r['of_recompute']} "
            f"that fit with recompute={lay.recompute}"
        )
    if not r["fits"] and "unranked" not in r:
        ranks = f"unranked, as it does not fit (its step time would place it at {ranks.removeprefix('rank ')})"
    print(f"  MFU {r['mfu']:.1%} of the BF16 peak; {ranks}")
    if not r["fits"]:
        print_what_would_fit(cfg, hw, lay, args, options, r)
    if life is not None:  # cli.plan_life
        from playbook.cli.plan_life import life_lines

        print("\n".join(f"  {line}" for line in life_lines(life, step["total"])))
    print(f"  ({LABEL_KEY})")
    return 0


def print_what_would_fit(cfg, hw, lay, args, options: dict, r: dict) -> None:
    """The single changes of ``cli.advice.layout_variants`` that fit, and the planner's fastest layout."""
    from playbook.cli.advice import layout_variants
    from playbook.theory.plan.layout import cost_layout

    fits = []
    for flags, variant in layout_variants(lay):
        v = cost_layout(cfg, hw, variant, seq_len=args.seq_len, rank=False, **options)
        if v["fits"]:
            fits.append(
                f"{flags} ({v['memory_total'] / 1e9:.1f} GB, margin {v['margin_bytes'] / 1e9:+.1f} GB, step {v['step']['total']:.2f} s)"
            )
    print("  what would fit: " + ("; ".join(fits[:3]) if fits else "no single change of recompute, zero or b"))
    best = r.get("fastest_that_fits")
    if best:
        print(
            f"  the planner's fastest layout that fits on {r['gpus']} GPUs: {best['layout']} ({best['step_s']:.2f} s a step)"
        )
