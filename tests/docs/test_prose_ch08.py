"""The numbers chapter 8's section "Before the step" states in prose, recomputed (its measured ones are
printed by its cells and held by tests/parallel/hybrid/test_hybrid_clip.py, tests/parallel/test_valid_tokens.py
and tests/parallel/test_reduce_precision.py)."""

import torch

from playbook.parallel.clip import EPS
from playbook.parallel.grads import FULL, SEQ, classify


def test_bf16_keeps_8_significant_bits_and_drops_a_half_ulp():
    """ "bf16 keeps 8 significant bits ... rounded to within 2⁻⁸ ... a contribution smaller than half a
    unit in the last place of the running sum disappears"."""
    assert torch.finfo(torch.bfloat16).eps == 2.0**-7  # 7 stored bits + the implicit one
    one = torch.tensor(1.0, dtype=torch.bfloat16)
    assert one + torch.tensor(2.0**-9, dtype=torch.bfloat16) == one  # below half an ulp of 1: gone
    assert one + torch.tensor(2.0**-8, dtype=torch.bfloat16) == one  # half an ulp, a tie: to even, gone
    assert one + torch.tensor(2.0**-7, dtype=torch.bfloat16) > one  # a whole ulp stays
    assert torch.finfo(torch.float32).eps == 2.0**-23  # fp32: 24 significant bits


def test_norms_without_sp_are_whole_on_every_tp_rank_and_the_clip_uses_torchs_epsilon():
    """ "a norm without SP is whole on every tp rank" (its gradient summed over dp×cp only: a tp
    duplicate); under SP it is summed over tp first; the scale is max_norm / (‖g‖ + 1e-6) as in torch."""
    assert classify("blocks.0.attn_norm.weight", None, tp=2, sequence_parallel=False, tied=False) is FULL
    assert "tp" not in FULL.axes
    assert classify("blocks.0.attn_norm.weight", None, tp=2, sequence_parallel=True, tied=False) is SEQ
    g = torch.ones(4)  # ‖g‖ = 2
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([p], 1.0)
    assert torch.equal(p.grad, g * (1.0 / (2.0 + EPS)))
