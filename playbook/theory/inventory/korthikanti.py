"""Korthikanti et al. 2022's activation count for a GPT-3 layer (*Reducing Activation Recomputation in
Large Transformer Models*, arXiv:2205.05198, Table 2), the reference every exact count of ours is
compared with (``theory.inventory.activations.korthikanti_vs_exact``). Re-exported by ``theory.hybrid.memory``."""

from __future__ import annotations

from playbook.config import require_divides, require_positive
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.theory.inventory.model_state import _choice


def activation_bytes_per_layer(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Bytes of activations one GPT-style transformer layer saves for backward, per tensor-parallel rank.

    Korthikanti et al. 2022 (arXiv:2205.05198), Table 2, with s = ``seq_len``, b = ``micro_batch``,
    h = ``hidden``, a = ``heads``, t = ``tp`` (16-bit activations, 1-byte dropout masks):

    ==============================================  =========================
    no parallelism                                  sbh(34 + 5as/h)
    tensor parallel                                 sbh(10 + 24/t + 5as/(ht))
    tensor + sequence parallel                      sbh(34/t + 5as/(ht))
    tensor parallel + selective recomputation       sbh(10 + 24/t)
    tensor + sequence parallel + selective recomp.  sbh(34/t)
    full recomputation                              sbh · 2
    ==============================================  =========================

    Selective recomputation drops the attention-score term 5as/h (softmax input and output,
    dropout mask and output: 5as²b bytes). Full recomputation keeps only each layer's 16-bit input,
    2sbh, and we return exactly the paper's ``2sbh`` whatever ``tp`` and ``sequence_parallel`` are.
    (With sequence parallelism Megatron-LM stores that input sharded along the sequence, 2sbh/t; the
    table does not make that distinction, and we follow the table.) With ``tp=1`` every row
    reduces to the no-parallelism one, so ``sequence_parallel`` changes nothing there.

    These constants describe the paper's GPT block (LayerNorm, GeLU, dropout). Our Llama-style model
    saves a different amount: see ``playbook.theory.inventory.activations.model_activation_bytes``.
    """
    require_positive(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, heads=heads, tp=tp)
    require_divides("tp", tp, "heads", heads)
    _choice("recompute", recompute, RECOMPUTE_MODES)
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")

    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return float(2 * sbh)
    # the attention-score term 5as/h · sbh = 5·a·s²·b, split over the t ranks' heads
    scores = 0.0 if recompute == "selective" else 5 * a * s * s * b / t
    if sequence_parallel:
        return sbh * 34 / t + scores
    return sbh * (10 + 24 / t) + scores
