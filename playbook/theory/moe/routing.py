"""Where routed tokens go: the capacity buffer's padded slots, and the all-to-all across nodes.

Pure arithmetic on routing counts and layouts, no torch.

- A *fixed-capacity* dispatch (GShard, Lepikhin et al. 2020, arXiv:2006.16668, §2.2; Switch, Fedus
  et al. 2021, arXiv:2101.03961, §2.2) gives every expert a buffer of C slots, ``[E, C, h]``: an
  expert routed more than C slots drops the rest, one routed fewer leaves slots of zeros that are
  still sent, stored and multiplied. :func:`capacity_buffer` counts both. Our layer is dropless in
  its traffic (variable-size all-to-all, as Megablocks, Gale et al. 2022, arXiv:2211.15841): it sends
  only the kept rows, so the padding is what a fixed-shape implementation would add.
- Across nodes, a token routed to k experts on N nodes of e experts each reaches D distinct nodes.
  Sent once per destination node and forwarded inside the node (DeepSeek-V3, arXiv:2412.19437,
  §3.2.2), the inter-node bytes scale with the remote nodes reached, not with k; node-limited routing
  caps D at M (DeepSeek-V3 §2.1.2: M = 4 of 8 nodes). :func:`nodes_reached` gives the distribution of
  D under uniform routing (exact, by inclusion–exclusion), :func:`cross_node_rows` the rows per token.
"""

from __future__ import annotations

from math import comb

from playbook.config import require_positive


def capacity_buffer(counts: list[int], capacity: int, *, hidden: int, dtype_bytes: int = 2) -> dict:
    """Slots of a fixed ``[E, C, h]`` dispatch buffer for routing ``counts`` [E] (slots per expert).

    Per expert: filled = min(count, C), padding = C − filled, dropped = count − filled. Returns those
    lists, their totals, and the bytes of the whole buffer against the bytes of the filled rows only
    (what a dropless, variable-size exchange sends)."""
    require_positive(capacity=capacity, hidden=hidden, dtype_bytes=dtype_bytes)
    if any(c < 0 for c in counts):
        raise ValueError(f"routing counts must be >= 0, got {counts}")
    filled = [min(c, capacity) for c in counts]
    padding = [capacity - f for f in filled]
    dropped = [c - f for c, f in zip(counts, filled)]
    row = hidden * dtype_bytes
    return {
        "filled": filled,
        "padding": padding,
        "dropped": dropped,
        "slots": capacity * len(counts),
        "filled_total": sum(filled),
        "padding_total": sum(padding),
        "dropped_total": sum(dropped),
        "buffer_bytes": capacity * len(counts) * row,
        "filled_bytes": sum(filled) * row,
    }


def nodes_reached(n_experts: int, top_k: int, nodes: int) -> list[float]:
    """P(D = d) for d = 0..nodes: the k distinct experts of a token, drawn uniformly from E experts
    spread evenly over ``nodes`` nodes (e = E/nodes each), fall on exactly d nodes.

    Ways to put k distinct experts on a given set of d nodes, every one of them used:
    Σⱼ (−1)ʲ C(d, j) C((d − j)·e, k) (inclusion–exclusion over empty nodes); times C(N, d) sets."""
    require_positive(n_experts=n_experts, top_k=top_k, nodes=nodes)
    if n_experts % nodes or top_k > n_experts:
        raise ValueError(f"need nodes | n_experts and top_k <= n_experts, got E={n_experts}, k={top_k}, nodes={nodes}")
    e, total = n_experts // nodes, comb(n_experts, top_k)
    onto = [sum((-1) ** j * comb(d, j) * comb((d - j) * e, top_k) for j in range(d + 1)) for d in range(nodes + 1)]
    return [comb(nodes, d) * onto[d] / total for d in range(nodes + 1)]


def cross_node_rows(n_experts: int, top_k: int, nodes: int, *, node_limit: int | None = None) -> dict:
    """Rows one token sends over the inter-node links in one dispatch (the combine sends as many back).

    - ``per_expert``: one copy per routed expert on another node, k·(N − 1)/N (no deduplication);
    - ``per_node``: one copy per remote node reached, E[D]·(N − 1)/N (given d nodes reached, the
      token's own node is among them with probability d/N);
    - ``node_limited``: the same with D capped at M = ``node_limit``, E[min(D, M)]·(N − 1)/N: the
      routing first picks at most M nodes, then the top-k experts inside them (DeepSeek-V3 §2.1.2),
      so the cap is reached whenever uniform routing would spread wider. None: no cap.
    """
    p = nodes_reached(n_experts, top_k, nodes)
    remote = (nodes - 1) / nodes
    limit = nodes if node_limit is None else node_limit
    if not 1 <= limit <= nodes or limit * (n_experts // nodes) < top_k:
        raise ValueError(
            f"node_limit must be in 1..{nodes} and its nodes must hold top_k={top_k} experts, got {node_limit}"
        )
    return {
        "per_expert": top_k * remote,
        "per_node": sum(d * q for d, q in enumerate(p)) * remote,
        "node_limited": sum(min(d, limit) * q for d, q in enumerate(p)) * remote,
    }


def ep_over_tp_bytes(n_experts: int, top_k: int, ranks: int, *, once_per: str = "expert") -> float:
    """Bytes of expert parallelism over those of tensor parallelism inside the experts, at the same
    degree ep = tp = ``ranks``, uniform routing, no drops (``theory.moe.moe``: 4 all-to-alls against 2
    all-gathers and 2 reduce-scatters of T·tp·h per step).

    - ``once_per="expert"``: a token is sent once per routed expert on another rank (our layer,
      and most all-to-all dispatchers): k·(n−1)/n rows against TP's (n−1): k/n.
    - ``once_per="rank"``: once per remote destination *rank*, its copies fanned out to that
      rank's experts there, and their outputs summed there before the combine (DeepEP; DeepSeek-V3
      §3.2.2 does it once per node): E[D]·(n−1)/n rows, D the distinct ranks reached: E[D]/n."""
    if once_per not in ("expert", "rank"):
        raise ValueError(f"once_per must be 'expert' or 'rank', got {once_per!r}")
    rows = cross_node_rows(n_experts, top_k, ranks)["per_expert" if once_per == "expert" else "per_node"]
    return rows / (ranks - 1)


def node_limited_rows_sampled(
    n_experts: int, top_k: int, nodes: int, node_limit: int, *, tokens: int = 20_000, seed: int = 0, scores="uniform"
) -> float:
    """Inter-node rows per token under node-limited routing as DeepSeek-V3 (§2.1.2) does it, sampled:
    per token, score every expert (i.i.d.: ``"uniform"`` on [0, 1], or ``"sigmoid"`` of a standard
    normal logit, V3's sigmoid affinities), keep the M = ``node_limit`` nodes with the highest *sum
    of their k/M best scores* (K_r/M in the report), take the top-k experts inside those nodes, and
    count the D distinct nodes they fall on: E[D]·(N − 1)/N. ``cross_node_rows``'s
    E[min(D, M)]·(N − 1)/N, which caps unconstrained top-k routing, lies slightly above it: on
    DeepSeek-V3's layout 3.49 against 3.46 (uniform) to 3.47 (sigmoid). Seeded: the same call gives
    the same number; its standard error is about 0.0015 at 20,000 tokens."""
    import numpy as np

    require_positive(n_experts=n_experts, top_k=top_k, nodes=nodes, node_limit=node_limit, tokens=tokens)
    if n_experts % nodes or top_k % node_limit or node_limit > nodes or top_k > node_limit * (n_experts // nodes):
        raise ValueError(
            f"need nodes | n_experts, node_limit | top_k and node_limit <= nodes, holding top_k experts; "
            f"got E={n_experts}, k={top_k}, nodes={nodes}, M={node_limit}"
        )
    rng, e = np.random.default_rng(seed), n_experts // nodes
    if scores == "uniform":
        s = rng.random((tokens, nodes, e))
    elif scores == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-rng.standard_normal((tokens, nodes, e))))
    else:
        raise ValueError(f"scores must be 'uniform' or 'sigmoid', got {scores!r}")
    node_score = np.sort(s, axis=2)[:, :, -(top_k // node_limit) :].sum(axis=2)  # [tokens, nodes]
    keep = np.argsort(-node_score, axis=1)[:, :node_limit]  # the M nodes of each token
    allowed = np.zeros((tokens, nodes), dtype=bool)
    np.put_along_axis(allowed, keep, True, axis=1)
    masked = np.where(allowed[:, :, None], s, -np.inf).reshape(tokens, n_experts)
    chosen = np.sort(np.argpartition(-masked, top_k - 1, axis=1)[:, :top_k] // e, axis=1)  # their nodes
    distinct = 1 + (chosen[:, 1:] != chosen[:, :-1]).sum(axis=1)
    return float(distinct.mean()) * (nodes - 1) / nodes
