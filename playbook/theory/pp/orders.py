"""Predict: the compute order of one rank under each pipeline schedule, ``[(kind, mb, chunk), ...]``
(GPipe, 1F1B, Megatron's interleaved 1F1B, ZB-H1, and the greedy zero-bubble variant);
``playbook.theory.pp.schedules.make_schedule`` adds the sends and receives. The papers and closed forms
are in ``playbook.theory.pp.schedules``' docstring.

Pure Python; no torch.
"""

from __future__ import annotations


# ---- generators: the compute order of one rank ------------------------------------------------
def _gpipe(p: int, m: int, r: int) -> list[tuple]:
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


def _one_f_one_b(p: int, m: int, r: int) -> list[tuple]:
    warm = min(p - r - 1, m)  # forwards before the first backward
    order = [("F", i, 0) for i in range(warm)]
    for i in range(m - warm):  # steady state: one forward, one backward
        order += [("F", warm + i, 0), ("B", i, 0)]
    return order + [("B", i, 0) for i in range(m - warm, m)]


def _interleaved(p: int, m: int, v: int, r: int) -> list[tuple]:
    """Megatron-LM's interleaved 1F1B: micro-batches go through the chunks in groups of p."""

    def which(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // p) % v
        return (k // (p * v)) * p + k % p, (v - 1 - chunk if backward else chunk)

    total = m * v
    # Megatron's warm-up: (v−1)·p forwards to fill the other chunks, plus 2(p−r−1) (twice 1F1B's, so
    # that each rank's sends and receives can overlap); it sets rank 0's memory, p(1 + (p−1)/(p·v)) stages
    warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    order = [("F", *which(k, False)) for k in range(warm)]
    for k in range(total - warm):
        order += [("F", *which(warm + k, False)), ("B", *which(k, True))]
    return order + [("B", *which(k, True)) for k in range(total - warm, total)]


def _zb_h1(p: int, m: int, r: int) -> list[tuple]:
    """ZB-H1 as Qi et al. 2023 (arXiv:2401.10241, §2.1, Figure 3) schedule it: 1F1B's order of F and
    B (warm-up of p − r − 1 forwards), each B followed by a W, with rank r's W passes delayed by r
    micro-batches (rank 0 runs W right after each B, the last rank p − 1 of them later). The delay
    fills the holes 1F1B leaves before each rank's first B, while F done and W not yet stays at
    (p − r) + r = p sets on every rank: 1F1B's peak (rank 0's), with the r W-only sets (small, §2)
    in place of full ones. Bubble per rank (p−1)(T_F+T_B−T_W) for m >= p (tests/theory/test_schedules.py)."""
    warm = min(p - r - 1, m)
    order: list[tuple] = [("F", i, 0) for i in range(warm)]
    done_w = 0

    def backward(i: int) -> None:
        nonlocal done_w
        order.append(("B", i, 0))
        if i - done_w >= r:  # the W of micro-batch i − r
            order.append(("W", done_w, 0))
            done_w += 1

    for i in range(m - warm):  # steady state: F, B, and the delayed W
        order.append(("F", warm + i, 0))
        backward(i)
    for i in range(m - warm, m):  # cool-down
        backward(i)
    return order + [("W", i, 0) for i in range(done_w, m)]


def _zb_greedy(p: int, m: int) -> list[list[tuple]]:
    """A greedy list schedule with a split backward (``"zb-h1-greedy"``; not the paper's ZB-H1): play
    the pipeline with unit costs and let each rank, whenever it is free, pick
    B (the input gradient: it is on the critical path back to rank 0) over F (allowed while fewer
    than p − r forwards are in flight on rank r, 1F1B's activation bound) over W (the weight
    gradient, which nothing waits for and so fills the gaps); once p W passes are waiting, W goes
    first. The recorded per-rank orders are the schedule. Its bubble equals ZB-H1's for m >= p, but
    deferring every W as late as it can keeps up to 2p − 1 − r sets on rank r until their W
    (7, 6, 5, 4 at p = 4, m = 8, against ZB-H1's 4 on every rank): where the W passes go is a
    memory decision, and Qi et al.'s order (``_zb_h1``) takes the one that costs nothing."""
    orders: list[list[tuple]] = [[] for _ in range(p)]
    free = [0.0] * p
    f_ready = [dict.fromkeys(range(m), 0.0)] + [{} for _ in range(p - 1)]  # mb -> input there at
    b_ready: list[dict] = [{} for _ in range(p)]  # mb -> gradient there at
    next_f, next_b, waiting_w = [0] * p, [0] * p, [[] for _ in range(p)]
    for _ in range(3 * m * p):
        best = None
        for r in range(p):
            options = []
            if next_b[r] < m and next_b[r] in b_ready[r]:
                options.append((max(free[r], b_ready[r][next_b[r]]), 1, "B", next_b[r]))
            if next_f[r] < m and next_f[r] - next_b[r] < p - r and next_f[r] in f_ready[r]:
                options.append((max(free[r], f_ready[r][next_f[r]]), 2, "F", next_f[r]))
            if waiting_w[r]:
                options.append((free[r], 0 if len(waiting_w[r]) >= p else 3, "W", waiting_w[r][0]))
            if options:
                start, _, kind, mb = min(options)
                if best is None or start < best[0]:
                    best = (start, r, kind, mb)
        start, r, kind, mb = best
        free[r] = start + 1.0
        orders[r].append((kind, mb, 0))
        if kind == "F":
            next_f[r] += 1
            (f_ready[r + 1] if r < p - 1 else b_ready[r])[mb] = free[r]
        elif kind == "B":
            next_b[r] += 1
            waiting_w[r].append(mb)
            if r > 0:
                b_ready[r - 1][mb] = free[r]
        else:
            waiting_w[r].pop(0)
    return orders
