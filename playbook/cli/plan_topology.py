"""``playbook plan --topology FILE`` and ``playbook serve-plan --topology FILE``: the same plans priced
on a topology's levels (``theory.plan.placed``), every mesh order searched unless ``--mesh-order``
names one, and where each axis of a layout sits (``--json``: ``placement``, axis → level).

playbook plan --model llama-3.1-70b --gpus 256 --topology dgx-h100-rail
playbook plan --model llama-3.1-8b --gpus 8 --seq-len 4096 --global-batch 32 --topology pcie-workstation
playbook serve-plan --model llama-3.1-8b --gpus 8 --topology data/topology/pcie-workstation.json
"""

from __future__ import annotations

import json

from playbook.cli.checks import BadInput
from playbook.cli.plan_layout import LABEL_KEY
from playbook.theory.topology.placement import ORDERS

TWO_LEVEL_ORDERS = ORDERS[:2]  # what a hardware profile alone can lay out (theory.plan.cost.MESH_ORDERS)
TOPOLOGY_HELP = (
    "price the plan on a topology's levels (NVLink domain, PCIe switch and socket, leaf, spine with its "
    "oversubscription, rails): a name in data/topology/ or a .json file; every mesh order is searched unless "
    "--mesh-order names one, and --json records each axis's level (placement). Its GPU profile replaces --hardware"
)


def add_topology_flag(p) -> None:
    p.add_argument("--topology", default=None, metavar="FILE", help=TOPOLOGY_HELP)


def mesh_order(args) -> str:
    """The order a plan without a topology uses: one of the two a hardware profile knows, or one line."""
    order = args.mesh_order or ORDERS[0]
    if order not in TWO_LEVEL_ORDERS:
        raise BadInput(
            f"--mesh-order {order} needs --topology (a hardware profile knows only {' and '.join(TWO_LEVEL_ORDERS)}); "
            f"try --topology dgx-h100-rail, or --mesh-order {ORDERS[0]}"
        )
    return order


def _topology(args):
    from playbook.theory.topology import load_topology

    try:
        return load_topology(args.topology)
    except ValueError as e:
        raise BadInput(str(e)) from None


def cmd_plan_topology(args, cfg, options: dict) -> int:
    """``plan --topology``: the fastest layouts over the orders searched, each with its placement."""
    from playbook.theory.plan.launch import torchrun_command
    from playbook.theory.plan.placed import crossings, placement_of, plan_orders

    topo = _topology(args)
    orders = (args.mesh_order,) if args.mesh_order else ORDERS
    options = {k: v for k, v in options.items() if k not in ("gpus_per_node", "mesh_order")}
    if args.gpus_per_node is not None:
        raise BadInput(
            f"--gpus-per-node with --topology: the topology sets it ({topo.node_gpus} for {topo.name}); omit it"
        )
    if args.layout:
        return _one_layout(args, cfg, topo, orders[0], options)
    kw = dict(gpus=args.gpus, seq_len=args.seq_len, global_batch=args.global_batch, attention=args.attention)
    kw |= dict(schedules=tuple(x for x in args.schedules.split(",") if x), **options)
    plans = plan_orders(cfg, topo, orders=orders, **kw)
    rows = sorted(
        ((c, o) for o, p in plans for c in p.candidates[: args.top]),
        key=lambda co: (co[0].cost.total, ORDERS.index(co[1])),
    )
    seen, top = set(), []
    for c, o in rows:
        if str(c.layout) not in seen and len(top) < args.top:
            seen.add(str(c.layout))
            top.append((c, o))
    best, order = top[0]
    launch = torchrun_command(
        best.layout, model=cfg.name, seq_len=args.seq_len, global_batch=args.global_batch, gpus_per_node=topo.node_gpus
    )
    if args.json:
        first = dict(plans)[order].as_dict(top=0)
        record = first | {
            "topology": topo.name,
            "levels": [lv.__dict__ for lv in topo.levels],
            "mesh_orders": list(orders),
            "candidates": [
                c.as_dict() | {"mesh_order": o, "placement": _levels(placement_of(topo, c.layout, o))} for c, o in top
            ],
            "crossings": crossings(topo, best.layout, order),
            "storage_bandwidth": topo.storage,  # bytes/s per node to checkpoint storage (theory.life.checkpoint)
            "launch": {"torchrun": launch},
        }
        print(json.dumps(record, indent=2))
        return 0
    levels = ", ".join(
        f"{lv.name} ×{lv.size} {lv.bandwidth / 1e9:g} GB/s"
        + (f" {lv.oversubscription:g}:1" if lv.oversubscription > 1 else "")
        for lv in topo.levels
    )
    print(
        f"{cfg.name} on {args.gpus} × {topo.hardware}, topology {topo.name} ({levels}), seq {args.seq_len}, "
        f"global batch {args.global_batch}; mesh orders searched: {', '.join(orders)}"
    )
    print(f"  {'layout':<40} {'order':<12} {'step':>8} {'exposed':>8} {'MFU':>6}  placement (axis: outermost level)")
    for c, o in top:
        print(
            f"  {str(c.layout):<40} {o:<12} {c.cost.total:>7.2f}s {c.cost.exposed:>7.2f}s {c.mfu:>6.1%}  "
            f"{_line(placement_of(topo, c.layout, o))}"
        )
    print(f"  ({LABEL_KEY})")
    print(f"torchrun:\n  {launch}")
    return 0


def _one_layout(args, cfg, topo, order: str, options: dict) -> int:
    """``--layout`` on a topology: ``cli.plan_layout.one_layout``'s costing, and where each axis sits."""
    from playbook.cli.plan_layout import one_layout
    from playbook.theory.plan.layout import parse_layout
    from playbook.theory.plan.placed import cost_on, on_topology, placement_of

    lay = parse_layout(args.layout, global_batch=args.global_batch)
    if args.json:
        r = cost_on(cfg, topo, lay, seq_len=args.seq_len, mesh_order=order, **options)
        print(json.dumps(r | {"placement": _levels(r["placement"])}, indent=2))
        return 0
    args.hardware = f"{topo.hardware} on {topo.name}"
    out = one_layout(cfg, on_topology(topo), args, dict(options, gpus_per_node=topo.node_gpus, mesh_order=order))
    print(f"  placement ({order}): {_line(placement_of(topo, lay, order))}")
    return out


def _levels(where: dict) -> dict[str, str]:
    return {a: w["outermost"] for a, w in where.items()}


def _line(where: dict) -> str:
    return ", ".join(f"{a}: {w['outermost']}" for a, w in where.items()) or "one GPU"


def cmd_serve_plan_topology(args, cfg) -> int:
    """``serve-plan --topology``: every tp × dp with tp's all-reduce priced where its group sits."""
    from playbook.theory.serving.layouts import recommend
    from playbook.theory.serving.serving import BY_SIZE

    topo = _topology(args)
    from playbook.theory.serving.on_topology import serve_layouts_on

    try:
        rows = serve_layouts_on(
            cfg,
            topo,
            gpus=args.gpus,
            context=args.context,
            mem_util=args.mem_util,
            block_size=args.block_size,
            dtype=args.dtype,
            latency=BY_SIZE if args.allreduce == "by-size" else None,
        )
    except ValueError as e:
        raise BadInput(str(e)) from None
    if not rows:
        raise BadInput(
            f"{cfg.name} does not fit {args.gpus} GPUs of {topo.name} with a {args.context}-token "
            "sequence at any tp; try a shorter --context or --dtype fp8"
        )
    best, why = recommend(rows)
    if args.json:
        print(
            json.dumps(
                {
                    "model": cfg.name,
                    "topology": topo.name,
                    "gpus": args.gpus,
                    "context": args.context,
                    "layouts": rows,
                    "placement": {r["layout"]: {"tp": r["tp_level"]} for r in rows},
                    "recommended": best["layout"],
                    "why": why,
                },
                indent=2,
            )
        )
        return 0
    print(f"{cfg.name} on {args.gpus} × {topo.hardware}, topology {topo.name}, context {args.context}, {args.dtype}")
    print(f"  {'layout':<9} {'tp spans':<12} {'TPOT b=1':>9} {'TPOT':>8} {'tokens/s':>9}")
    for r in rows:
        print(
            f"  {r['layout']:<9} {r['tp_level']:<12} {r['tpot_batch1'] * 1e3:>7.1f}ms {r['tpot'] * 1e3:>6.1f}ms "
            f"{r['tokens_per_s']:>9,.0f}"
        )
    print(f"recommended: {best['layout']}: {why}")
    return 0
