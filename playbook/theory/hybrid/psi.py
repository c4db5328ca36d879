"""Model state and data-parallel traffic in units of Ψ (the parameter count): the tables of chapters 0 and 2.

Pure arithmetic on :func:`playbook.theory.hybrid.memory.model_state_bytes` and
:func:`playbook.theory.cost.comm.sent_bytes`, with Ψ = 1 so that every number *is* a multiple of Ψ.

Sources
-------
- Rajbhandari et al. 2019, *ZeRO*, arXiv:1910.02054: §3.1 (2 + 2 + K bytes per parameter, K = 12),
  §5 (what each stage shards) and §7 (DP and ZeRO-1/2 move 2Ψ elements per step, ZeRO-3 3Ψ).
- Dettmers et al. 2022, *8-bit Optimizers via Block-wise Quantization*, arXiv:2110.02861, §2:
  Adam's two states stored in 8 bits, with one fp32 absolute maximum per block of 2,048 values.
- Tazi et al. 2025, *The Ultra-Scale Playbook* (Hugging Face): the fp32 gradient-accumulation column.
"""

from __future__ import annotations

from playbook.theory.cost.comm import sent_bytes
from playbook.theory.inventory.model_state import model_state_bytes
from playbook.theory.zero.zero import check_stage

# 8-bit Adam (Dettmers et al. 2022): each state is one byte per value plus one fp32 scale per block.
ADAM8_BLOCK = 2048


def _per_param(m) -> dict[str, float]:
    return {"weights": m.params, "gradients": m.grads, "optimizer": m.optimizer, "total": m.total}


def bytes_per_parameter(*, block: int = ADAM8_BLOCK) -> list[dict]:
    """Bytes per parameter of weights, gradients and Adam state for five common setups (no sharding).

    - mixed precision (ZeRO's accounting): 2 + 2 + 12 = 16;
    - fp32: 4 + 4 + 8 = 16;
    - mixed with fp32 gradient accumulation, two conventions (``model_state_bytes``): Megatron-LM's
      ``main_grad`` replaces the bf16 gradient, 2 + 4 + 12 = 18; keeping the bf16 gradient beside
      the fp32 buffer (the Ultra-Scale Playbook's "BF16 w/ FP32 grad acc") costs 2 + (2 + 4) + 12 = 20;
    - mixed with 8-bit Adam: momentum and variance take one byte each plus 4/``block`` bytes of
      scale (Dettmers et al. 2022, arXiv:2110.02861, who quantize the optimizer state only); with
      the fp32 master copy that mixed-precision frameworks keep (their choice, not the paper's):
      2 + 2 + 4 + 2·(1 + 4/block) ≈ 10.
    """
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer (values per quantization scale), got {block!r}")
    rows = [
        ("mixed precision (bf16 + fp32 master, Adam)", model_state_bytes(1)),
        ("fp32 (weights, grads, Adam)", model_state_bytes(1, precision="fp32")),
        (
            "mixed + fp32 main_grad (Megatron-LM: replaces the bf16 gradient)",
            model_state_bytes(1, fp32_grad_accum="main_grad"),
        ),
        (
            "mixed + fp32 grad accumulation (bf16 gradient kept too: Ultra-Scale Playbook)",
            model_state_bytes(1, fp32_grad_accum="both"),
        ),
    ]
    out = [{"setup": name, **_per_param(m)} for name, m in rows]
    mixed = model_state_bytes(1)
    adam_fp32 = 8.0  # momentum + variance in fp32, part of ZeRO's K = 12 (the other 4 is the master copy)
    adam8 = 2 * (1 + 4 / block)
    optimizer = mixed.optimizer - adam_fp32 + adam8
    out.append(
        {
            "setup": "mixed + 8-bit Adam (block-wise, fp32 master kept)",
            "weights": mixed.params,
            "gradients": mixed.grads,
            "optimizer": optimizer,
            "total": mixed.params + mixed.grads + optimizer,
        }
    )
    return out


# ---- chapter 2: ZeRO in Ψ units ----------------------------------------------------------------
_FORMULAS = {  # per-rank model state in mixed precision, bytes (ZeRO §5, Figure 1)
    0: ("2Ψ", "2Ψ", "12Ψ"),
    1: ("2Ψ", "2Ψ", "12Ψ/N"),
    2: ("2Ψ", "2Ψ/N", "12Ψ/N"),
    3: ("2Ψ/N", "2Ψ/N", "12Ψ/N"),
}
_TRAFFIC = {  # collectives per step and the elements they move (ZeRO §7), before the (N−1)/N of a ring
    0: ("all-reduce(grads)", 2),
    1: ("reduce-scatter(grads) + all-gather(weights)", 2),
    2: ("reduce-scatter(grads) + all-gather(weights)", 2),
    3: ("2 × all-gather(weights) + reduce-scatter(grads)", 3),
}


def zero_psi_rows(n: int) -> list[dict]:
    """One row per stage: per-rank memory (formula and multiple of Ψ bytes at ``n`` ranks) and the
    traffic (formula, and bf16 bytes each rank sends as a multiple of Ψ at ``n`` ranks)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of data-parallel ranks, got {n!r}")
    rows = []
    for stage in range(4):
        check_stage(stage)
        m = model_state_bytes(1, dp=n, zero=stage)
        op, elements = _TRAFFIC[stage]
        if stage == 0:
            sent = sent_bytes("all_reduce", 2.0, n)
        else:
            gathers = 2 if stage == 3 else 1
            sent = sent_bytes("reduce_scatter", 2.0, n) + gathers * sent_bytes("all_gather", 2.0, n)
        p, g, o = _FORMULAS[stage]
        rows.append(
            {
                "stage": "DP" if stage == 0 else f"ZeRO-{stage}",
                "memory per rank": f"{p} + {g} + {o}",
                f"bytes/Ψ at N={n}": m.total,
                "collectives per step": op,
                "elements moved": f"{elements}Ψ",
                f"bf16 bytes sent/Ψ at N={n}": sent,
            }
        )
    return rows
