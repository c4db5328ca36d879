"""What ``playbook run hybrid`` composes: the one table of layout refusals that the hybrid's check
(``theory.hybrid.plan.Plan.check``), the planner's shrinker (``theory.plan.shrink``) and the dashboards read.

Every axis composes with every other (data, tensor + sequence, pipeline with virtual stages and a
split backward, context, expert; ZeRO 1-3 over dp×cp with routed experts over their replicas;
recomputation; a tied embedding over its first and last stage; gradient accumulation): every pair
of them runs on real ranks against one process (tests/parallel/hybrid/test_hybrid_matrix.py). What is refused is a
fact of the layout or the model, and its line says which: nothing to split or shard over, tokens or
heads that do not divide.

Pure Python: no torch, so the planner can ask before anything is imported.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims


def refusal(
    cfg: ModelConfig,
    dims: ParallelDims,
    *,
    zero: int = 0,
    sequence_parallel: bool = False,
    seq_len: int | None = None,
    cp_variant: str = "ring",
) -> str | None:
    """The first rule of the table ``dims`` and these options break, as one line naming it and what
    would work; None when ``playbook run hybrid`` composes them."""
    d = dims
    rules = [
        (  # a fact of the layout: no tp ranks to split the sequence over
            sequence_parallel and d.tp == 1,
            "sequence parallelism splits the sequence over the tp ranks: it needs tp > 1",
        ),
        (  # a fact of the layout: ZeRO's collectives would run on one rank, on no axis
            zero and d.dp * d.cp == 1,
            f"ZeRO-{zero} shards over the dp×cp ranks that hold the same weights, and dp·cp=1 in {d}: "
            "add --dp 2 (or --cp 2) or drop --zero",
        ),
        (  # a fact of the layout: the tokens of a cp shard do not split into tp slices
            cfg.is_moe and d.tp > 1 and seq_len is not None and (seq_len // d.cp) % d.tp,
            f"each tp rank routes its slice of an MoE layer's sequence, and tp={d.tp} does not divide "
            f"the {(seq_len or 0) // d.cp} tokens per cp rank; use a seq_len that is a multiple of cp·tp={d.cp * d.tp}",
        ),
        (  # a fact of the model: Ulysses scatters whole kv heads over cp
            d.cp > 1 and cp_variant == "ulysses" and (cfg.kv_heads // d.tp) % d.cp,
            f"Ulysses over cp={d.cp} needs cp to divide the kv heads per tp rank ({cfg.kv_heads // d.tp})",
        ),
    ]
    return next((why for broken, why in rules if broken), None)
