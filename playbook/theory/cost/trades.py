"""What each strategy sends per micro-batch: pipeline point-to-point beside tensor-parallel collectives.

Pure arithmetic. With micro-batch b, sequence s, hidden h, L layers and B bytes per element:

- pipeline parallelism (Huang et al. 2019, *GPipe*, arXiv:1811.06965; Narayanan et al. 2021,
  arXiv:2104.04473, §3.2): one activation ``[b, s, h]`` per stage boundary forward and one
  gradient of the same size backward, B·bsh bytes each, whatever the number of layers per stage;
- tensor parallelism (Shoeybi et al. 2019, arXiv:1909.08053; Korthikanti et al. 2022, §4.2.2):
  two all-reduces of B·bsh bytes per layer forward, 2·B·bsh(t−1)/t sent each by ring, so
  4·B·bsh(t−1)/t per layer, L/pp layers per rank.
"""

from __future__ import annotations

from playbook.config import ModelConfig, require_positive
from playbook.theory.cost.comm import sent_bytes


def p2p_vs_tp_bytes(
    cfg: ModelConfig, *, seq_len: int, micro_batch: int, pp: int, tp: int, dtype_bytes: int = 2
) -> list[dict]:
    """Bytes one rank sends in the forward of one micro-batch: as a pipeline stage over ``pp`` stages,
    and as a tensor-parallel rank over ``tp`` (all L layers). The backward sends the same again."""
    require_positive(seq_len=seq_len, micro_batch=micro_batch, pp=pp, tp=tp, dtype_bytes=dtype_bytes)
    if pp < 2 or tp < 2:
        raise ValueError(f"compare pp >= 2 with tp >= 2 (one rank communicates nothing), got pp={pp}, tp={tp}")
    activation = dtype_bytes * micro_batch * seq_len * cfg.hidden
    tp_layer = 2 * sent_bytes("all_reduce", activation, tp)
    return [
        {
            "strategy": f"pipeline, {pp} stages",
            "what crosses the link": "one activation to the next stage (send/recv)",
            "messages": 1,
            "bytes per micro-batch": float(activation),
        },
        {
            "strategy": f"tensor parallel, t={tp}",
            "what crosses the link": f"2 all-reduces per layer × {cfg.n_layers} layers",
            "messages": 2 * cfg.n_layers,
            "bytes per micro-batch": cfg.n_layers * tp_layer,
        },
    ]


# Every training strategy of chapters 1-6 as a trade. Ψ parameters, B bytes per element, n the degree,
# b·s·h one micro-batch's activation; per training step unless said otherwise. "runs" names the
# ``playbook run`` strategies that implement the row (a test holds the table to the registry).
STRATEGY_TRADES: list[dict[str, str]] = [
    {
        "strategy": "data parallel (ch. 1)",
        "runs": "dp",
        "shards": "the batch",
        "communicates": "all-reduce of the gradients: 2(n−1)/n·BΨ",
        "link": "any; overlapped with backward but the last bucket",
        "costs": "every rank holds the whole model state (16Ψ in mixed precision)",
    },
    {
        "strategy": "ZeRO-1/2 (ch. 2)",
        "runs": "zero",
        "shards": "optimizer states (1), + gradients (2)",
        "communicates": "reduce-scatter + all-gather: 2(n−1)/n·BΨ, as DP",
        "link": "any",
        "costs": "nothing in bytes; weights still whole on every rank",
    },
    {
        "strategy": "ZeRO-3 / FSDP (ch. 2)",
        "runs": "zero, fsdp2",
        "shards": "+ the weights",
        "communicates": "2 all-gathers + reduce-scatter: 3(n−1)/n·BΨ (1.5× DP)",
        "link": "any; gathers prefetched behind compute",
        "costs": "the largest unit whole in memory for a moment; more latency-bound messages",
    },
    {
        "strategy": "tensor parallel (+SP) (ch. 3)",
        "runs": "tp",
        "shards": "weights and the hidden dimension of activations (+ the sequence of norms with SP)",
        "communicates": "4 all-reduces of B·bsh per layer (SP: all-gather + reduce-scatter, same bytes)",
        "link": "inside a node; on the critical path unless overlapped (Megatron-LM's TP communication overlap, async TP)",
        "costs": "t ≤ KV heads; small matmuls at large t",
    },
    {
        "strategy": "pipeline parallel (ch. 4)",
        "runs": "pp",
        "shards": "the layers",
        "communicates": "send/recv of B·bsh per micro-batch per stage boundary, each way",
        "link": "any, even across nodes",
        "costs": "bubble (p−1)/(m+p−1) with 1F1B; stage 0 still holds one micro-batch of the whole model",
    },
    {
        "strategy": "context parallel (ch. 5)",
        "runs": "cp",
        "shards": "the sequence",
        "communicates": "K/V blocks around a ring: (n−1) steps of 2·B·b·(s/n)·g·d per layer, twice in backward",
        "link": "overlapped with attention when each rank's s/n tokens are enough",
        "costs": "causal load balance needs zig-zag; short sequences expose the ring",
    },
    {
        "strategy": "expert parallel (ch. 6)",
        "runs": "ep",
        "shards": "the experts",
        "communicates": "2 all-to-alls per MoE layer (dispatch, combine), ≈ k·(n−1)/n·B·bsh each sent once per "
        "(token, expert), less sent once per destination rank (DeepEP); ×2 in backward",
        "link": "inside a node; across nodes capped by node-limited routing",
        "costs": "load imbalance: the busiest expert sets the pace; capacity drops or padding",
    },
]
