"""FP8 as a precision option of the planner's step time (pure arithmetic, no torch).

DeepSeek-V3 trains its GEMMs in FP8 (DeepSeek-AI 2024, arXiv:2412.19437, §3.3): the forward, the
input gradient and the weight gradient of every linear layer, while "the embedding module, the
output head, MoE gating modules, normalization operators, and attention operators" keep BF16 or
FP32 (§3.3.1). So with ``precision="fp8"`` the planner runs the FLOPs of the linear layers at the
device's dense FP8 peak and the rest (attention's q·kᵀ and probs·v, the output head, the router) at
its BF16 peak, both times the profile's achievable fraction; recomputed FLOPs follow the same split.
On the wire, §3.3.4: the activations before the MoE up-projections are dispatched in FP8 and the
activation gradients before the down-projections likewise, while both combines stay BF16, so ep's
all-to-all moves 3/4 of the BF16 bytes; tp, cp, pp and dp stay BF16 (DeepSeek-V3 has no tp).

The FP8 peak is ``peak_fp8_flops`` of the hardware profile's file (``data/hardware/``, or the file
``--hardware FILE`` names: ``Hardware.peak_fp8_flops``; H100 and
H200: 1,979 TFLOPS dense, twice BF16, their datasheets); a profile without it refuses FP8. MFU stays
model FLOPs over the BF16 peak, as the papers report it. Not modelled: FP8's memory (DeepSeek-V3
caches some activations in FP8 and keeps AdamW's moments in BF16, §3.3.3), its quantization kernels.
"""

from __future__ import annotations

import functools
import json

from playbook.config import ModelConfig
from playbook.hardware import HARDWARE_DIR, Hardware
from playbook.theory.cost.flops import attention_flops_per_token, flops_per_token

PRECISIONS = ("bf16", "fp8")
FP8_DISPATCH_SHARE = 0.75  # ep bytes in FP8 vs BF16: dispatch (fwd) and its gradient (bwd) at 1 byte, combines at 2


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def fp8_peak(hw: Hardware) -> float:
    """Dense FP8 FLOP/s of the profile ``hw`` (``peak_fp8_flops`` of the file it was read from, a
    shipped one or ``--hardware FILE``), or one line saying which shipped profiles have one."""
    if not hw.peak_fp8_flops:
        have = sorted(p.stem for p in HARDWARE_DIR.glob("*.json") if "peak_fp8_flops" in json.loads(p.read_text()))
        raise ValueError(f"{hw.name} has no FP8 peak in its profile; --precision fp8 needs one of {', '.join(have)}")
    return float(hw.peak_fp8_flops)


@functools.lru_cache(maxsize=256)
def fp8_share(cfg: ModelConfig, seq_len: int) -> float:
    """Share of a training step's FLOPs in linear layers FP8 runs: all but attention's two [T, T]
    products, the output head (6·V·h per token), the MoE router (6·h·E per MoE layer) and the norms'
    weights that PaLM's 6N counts (two per layer and the final one, h each; MLA's extra norms not)."""
    total = flops_per_token(cfg, seq_len)
    bf16 = (
        cfg.vocab_size * cfg.hidden
        + cfg.n_moe_layers * cfg.hidden * cfg.n_experts
        + (2 * cfg.n_layers + 1) * cfg.hidden
    )
    return (total - attention_flops_per_token(cfg, seq_len) - 6 * bf16) / total


def time_factor(cfg: ModelConfig, hw: Hardware, seq_len: int, precision: str) -> float:
    """Compute time in ``precision`` over compute time in BF16 (1 for bf16)."""
    check_precision(precision)
    if precision == "bf16":
        return 1.0
    share = fp8_share(cfg, seq_len)
    return share * hw.peak_bf16_flops / fp8_peak(hw) + (1 - share)
