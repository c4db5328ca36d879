"""Which data-parallel replica serves a request: round robin, or where its prefix is cached.

Each replica has its own KV cache, so a prefix cached on one replica does nothing for a request
sent to another. Round robin spreads the load evenly and spreads every shared prefix over all
replicas (each computes it once). A prefix-aware router sends a request to the replica already
holding the longest part of its prompt, and balances load among the others: SGLang's router does
this with an approximate radix tree per worker (Zheng et al. 2024, "SGLang", the cache-aware
scheduling of §3); this one keeps the set of block-aligned prefixes it has sent to each replica
(it never learns of evictions, as such a router does not).
"""

from __future__ import annotations

POLICIES = ("round-robin", "prefix")


def route(prompts, *, dp: int, block_size: int, policy: str = "round-robin") -> list[int]:
    """The replica (0..dp−1) of each prompt, in arrival order."""
    if policy not in POLICIES:
        raise ValueError(f"router policy {policy!r} is not one of {', '.join(POLICIES)}")
    if policy == "round-robin":
        return [i % dp for i in range(len(prompts))]
    seen: list[set] = [set() for _ in range(dp)]  # block-aligned prefixes sent to each replica
    load = [0] * dp  # prompt tokens sent to each replica
    out = []
    for prompt in prompts:
        prefixes = [tuple(prompt[: (k + 1) * block_size]) for k in range(len(prompt) // block_size)]

        def found(r):
            n = 0
            while n < len(prefixes) and prefixes[n] in seen[r]:
                n += 1
            return n

        best = max(range(dp), key=lambda r: (found(r), -load[r], -r))
        seen[best].update(prefixes)
        load[best] += len(prompt)
        out.append(best)
    return out
