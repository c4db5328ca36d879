"""When disaggregating prefill from decode pays: the KV transfer against the stall it removes (pure).

A prompt of p tokens prefilled on a separate instance must ship its KV cache, ``paged_kv_bytes``
of it (``theory.serving.serving``; for a tp-way prefill instance each rank sends its 1/tp share, in
parallel), over the link between the instances. Co-located, the same prefill instead stalls every
running decode of its replica for the prefill's time (chapter 7 §4c; DistServe, Zhong et al.
2024, §2–3; Splitwise, Patel et al. 2024, §4). ``transfer`` compares the two on one link:
within a node over NVLink the transfer is a small fraction of the prefill; across nodes over the
inter-node network it can approach it, and for short prompts the fixed cost of a second instance
is not repaid (decode-heavy traffic with short prompts barely stalls at all).
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving import serving


def transfer(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    prompt: int,
    tp: int = 1,
    inter_node: bool = False,
    block_size: int = serving.BLOCK_SIZE,
    dtype: str = "bf16",
    **rates,
) -> dict:
    """KV bytes one prefill rank sends for one ``prompt``, the seconds they take on the link, and the
    prefill's own seconds (what a co-located decode would wait)."""
    per_token = serving.kv_bytes_per_token(cfg, tp=tp, dtype=dtype)
    nbytes = serving.paged_kv_bytes([prompt], per_token, block_size)
    link = hw.inter_node_bandwidth if inter_node else hw.intra_node_bandwidth
    stall = serving.prefill(cfg, hw, prompt=prompt, tp=tp, dtype=dtype, **rates).seconds
    seconds = nbytes / link
    return {
        "kv_bytes_per_rank": nbytes,
        "transfer_seconds": seconds,
        "prefill_seconds": stall,
        "transfer_over_prefill": seconds / stall,
    }
