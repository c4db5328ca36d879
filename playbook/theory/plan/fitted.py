"""The three choices that calibrate the planner on two published tables (``theory.plan.validation``:
Megatron-LM's Table 1, Narayanan et al. 2021; Llama 3's Table 4, Dubey et al. 2024), each made where
its alternative misses, and the ratio (predicted over published MFU) that alternative gives, so that
one table can show both (chapter 8b, "Calibrated on published runs"):

- **overlap** (Megatron-LM): "none", its 2021 local DDP all-reducing after the last backward;
  the alternative "dp", today's bucketed overlap (``theory.plan.dp``);
- **b and v** (Megatron-LM): Table 1 prints neither the micro-batch nor the chunks per stage; the
  planner's fastest (``validation.megatron_unprinted``); the alternative, any other b, v that fits
  (``validation.unprinted_options``), given as the range of all their ratios;
- **attention count** (Llama 3): a causal count, half of both [T, T] products; the alternative,
  PaLM's 6N + 12·L·H·Q·T (Chowdhery et al. 2022, Appendix B), the count Llama 3 cites for its MFU
  (§3.3.2).

Fitted on these rows, the ratios say what the calibration absorbed, not how well the planner predicts:
that takes runs it was not fitted on. No torch.
"""

from __future__ import annotations

from playbook.hardware import Hardware
from playbook.theory.plan.layout import cost_layout, parse_layout
from playbook.theory.plan.validation import PublishedRun, unprinted_options

# choice -> (what the calibration uses, its alternative): the keys ``PublishedRun.fitted`` names
FITTED = {
    "overlap": ('"none": every collective exposed', '"dp": gradient buckets behind the backward'),
    "b and v": ("the planner's fastest that fits", "any b of 1, 2, 4, 8 and v that fits"),
    "attention count": ("causal: the masked half left out", "PaLM's: both [T, T] products whole"),
}


def alternatives(run: PublishedRun, row: dict) -> dict:
    """``row``: ``validate(run)``'s. ``calibrated``: the ratio as calibrated (``row["ratio_compared"]``);
    per choice ``run`` fitted, its alternative's ratio, None for a choice it did not fit:
    ``dp_overlap`` (the same layout, overlap "dp"), ``b_v`` ((lowest, highest, how many) over every
    b, v that fits, the calibrated one included: it is the fastest, so the highest), ``palm`` (the
    published MFU read in PaLM's count, ``row["ratio"]``)."""
    unknown = set(run.fitted) - set(FITTED)
    if unknown:
        raise ValueError(f"{run.run}: fitted choices are {', '.join(FITTED)}; got {', '.join(sorted(unknown))}")
    hw = Hardware.preset(run.hardware)
    lay = parse_layout(run.layout, global_batch=run.global_batch)
    out = {"calibrated": row["ratio_compared"], "dp_overlap": None, "b_v": None, "palm": None}
    if "overlap" in run.fitted:
        other = cost_layout(run.cfg, hw, lay, seq_len=run.seq_len, rank=False, overlap="dp")
        out["dp_overlap"] = other["mfu"] / run.published_mfu
    if "b and v" in run.fitted:
        degrees = f"dp={lay.dp} tp={lay.tp} pp={lay.pp} cp={lay.cp} zero={lay.zero} recompute={lay.recompute}"
        options = unprinted_options(run.cfg, degrees, run.global_batch, hw)
        ratios = [r["mfu"] / run.published_mfu for r in options.values()]
        out["b_v"] = (min(ratios), max(ratios), len(ratios))
    if "attention count" in run.fitted:
        out["palm"] = row["ratio"]
    return out
