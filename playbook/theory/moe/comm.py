"""A mixture of experts' all-to-all bytes per rank, from routing counts (Lepikhin et al. 2020, *GShard*,
arXiv:2006.16668: dispatch and combine; DeepSpeed-MoE, Rajbhandari et al. 2022, arXiv:2201.05596,
§5: expert-parallel groups inside data parallelism), beside tensor-parallel experts' gathers, and the
routing report of ``playbook run ep``. Re-exported by ``theory.moe.moe``. Pure arithmetic, no torch.
"""

from __future__ import annotations

from playbook.theory.moe.capacity import imbalance, kept_counts, load_entropy


# ---- communication -----------------------------------------------------------------------------
def alltoall_rows(kept: list[list[int]], ep: int) -> list[dict[str, int]]:
    """Rows (tokens) each rank sends in the dispatch and in the combine all-to-all of one MoE layer.

    ``kept[r][e]``: slots data-rank r keeps for expert e. Ranks form EP groups of ``ep``
    consecutive ranks; member i of a group owns experts [i·E/ep, (i+1)·E/ep). Dispatch: rank r
    sends every kept slot whose expert lives on another member of its group; combine: it sends
    back every row it received from another member."""
    n, E = len(kept), len(kept[0])
    per = E // ep
    out = []
    for r in range(n):
        group0, me = r - r % ep, r % ep
        mine = range(me * per, (me + 1) * per)
        dispatch = sum(c for e, c in enumerate(kept[r]) if e not in mine)
        combine = sum(kept[s][e] for s in range(group0, group0 + ep) if s != r for e in mine)
        out.append({"dispatch": dispatch, "combine": combine})
    return out


def alltoall_bytes_per_step(kept: list[list[int]], ep: int, hidden: int, dtype_bytes: int = 4) -> list[float]:
    """Bytes each rank sends through all-to-all in one training step of one MoE layer: forward
    dispatch + forward combine, and backward, where each all-to-all runs again with its splits
    swapped (the gradient of the combine goes out as the dispatch came in, and vice versa):
    2 · (dispatch + combine) · h · bytes."""
    return [2.0 * (r["dispatch"] + r["combine"]) * hidden * dtype_bytes for r in alltoall_rows(kept, ep)]


def uniform_alltoall_bytes(tokens_per_rank: int, top_k: int, ep: int, hidden: int, dtype_bytes: int = 4) -> float:
    """Expected bytes per rank per all-to-all under perfectly even routing and no drops:
    k · T_local · h · bytes · (ep − 1)/ep (each slot leaves the rank unless its expert is local)."""
    return top_k * tokens_per_rank * hidden * dtype_bytes * (ep - 1) / ep


def tp_experts_bytes_per_step(tokens_per_rank: int, tp: int, hidden: int, dtype_bytes: int = 4) -> float:
    """Tensor parallelism inside each expert (the contrast): tokens are all-gathered over the tp
    ranks and the partial outputs reduce-scattered back; backward swaps the two. Each is a ring
    collective of T_local · tp · h elements: 4 · T_local · tp · h · bytes · (tp − 1)/tp per step.
    Against EP's 4 · k · T_local · h · bytes · (ep − 1)/ep under even routing: a ratio of k / tp."""
    return 4 * tokens_per_rank * tp * hidden * dtype_bytes * (tp - 1) / tp


def alltoall_bytes_from_routing(
    routing: list[list[dict]], ep: int, hidden: int, dtype_bytes: int = 4
) -> list[list[float]]:
    """[step][rank] bytes sent through all-to-all by every MoE layer together, from the routing
    counts alone (``routing[step][layer]`` with ``counts_by_rank`` and ``capacity``)."""
    out = []
    for layers in routing:
        per_rank = [0.0] * len(layers[0]["counts_by_rank"])
        for layer in layers:
            kept = kept_counts(layer["counts_by_rank"], layer["capacity"])
            for r, b in enumerate(alltoall_bytes_per_step(kept, ep, hidden, dtype_bytes)):
                per_rank[r] += b
        out.append(per_rank)
    return out


def routing_report(
    routing: list[list[dict]],
    ce: list[float],
    ep: int,
    hidden: int,
    measured_bytes: list[list[float]],
    seconds: list[list[float]],
) -> dict:
    """The ``routing`` block of ``playbook run ep --json``: per step and MoE layer, tokens per
    expert, kept, dropped, imbalance, entropies, aux loss, load per EP rank; per step the
    all-to-all bytes per rank predicted from the counts beside those measured, and the time."""
    per = len(routing[0][0]["counts"]) // ep
    predicted = alltoall_bytes_from_routing(routing, ep, hidden)
    steps = []
    for s, layers in enumerate(routing):
        rows = [
            {
                "tokens_per_expert": L["counts"],
                "kept_per_expert": L["kept"],
                "capacity": L["capacity"],
                "dropped": L["dropped"],
                "imbalance": imbalance(L["counts"]),
                "load_entropy": load_entropy(L["counts"]),
                "router_entropy": L["router_entropy"],
                "aux": L["aux"],
                "load_per_rank": [sum(L["kept"][i * per : (i + 1) * per]) for i in range(ep)],
            }
            for L in layers
        ]
        steps.append(
            {
                "layers": rows,
                "ce": ce[s],
                "alltoall_bytes_per_rank": {"predicted": predicted[s], "measured": measured_bytes[s]},
                "alltoall_seconds_per_rank": seconds[s],
            }
        )
    return {"ep": ep, "steps": steps}
