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
