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
from playbook.theory.comm import sent_bytes


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
