"""What would fit: for a ``playbook memory`` or ``plan --layout`` answer that does not fit, the smallest
changes that do, each with its new total and margin, cheapest first.

"Smallest" follows what a change costs the run: a fused attention kernel costs nothing; recomputation
costs compute (selective: the attention core, full: a forward per layer, Korthikanti et al. 2022,
arXiv:2205.05198, §4-5); a higher ZeRO stage costs communication (Rajbhandari et al. 2019,
arXiv:1910.02054, §7: stage 3 sends 1.5× stage 2's bytes); more tensor or pipeline ranks cost
collectives inside the step or a bubble, and GPUs. One change at a time in that order; when none fits
alone, the same changes one after another until the total fits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    """One change to the flags, and what the most loaded rank then holds."""

    flags: str  # e.g. "--recompute full"
    total_bytes: float
    allowed_bytes: float

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.allowed_bytes

    def line(self) -> str:
        verb = "fits" if self.fits else "still over"
        return f"{self.flags}: {self.total_bytes / 1e9:.1f} GB, {verb} (margin {(self.allowed_bytes - self.total_bytes) / 1e9:+.1f} GB)"


def training_total(cfg, options: dict) -> float:
    """Bytes on the most loaded training rank for ``playbook memory``'s ``options`` (its flags as keywords:
    seq_len, micro_batch, dp, zero, tp, cp, ep, pp, sequence_parallel, precision, recompute,
    fp32_grad_accum, attention)."""
    from playbook.theory.hybrid.memory import training_memory
    from playbook.theory.hybrid.stages import layout_stage_memory, most_loaded_stage

    if options.get("pp", 1) > 1:
        stages = layout_stage_memory(cfg, **options)
        return stages[most_loaded_stage(stages)].memory.total
    return training_memory(cfg, **options).total


MODES = ("none", "selective", "full")


def _ladder(cfg, options: dict) -> list[tuple[str, str, dict]]:
    """The single changes worth trying, cheapest first, each as (kind, flags, new options); within a
    kind, weakest first."""
    o, out = options, []
    if o.get("attention", "eager") == "eager":
        out.append(("attention", "--attention flash", {"attention": "flash"}))
    out += [
        ("recompute", f"--recompute {m}", {"recompute": m})
        for m in MODES[MODES.index(o.get("recompute", "none")) + 1 :]
    ]
    if o.get("dp", 1) > 1:
        out += [("zero", f"--zero {z}", {"zero": z}) for z in range(o.get("zero", 0) + 1, 4)]
    for k in (2, 4, 8):
        tp = o.get("tp", 1) * k
        if tp <= 8 and cfg.kv_heads % tp == 0 and cfg.n_heads % tp == 0:
            out.append(("tp", f"--tp {tp} --sequence-parallel", {"tp": tp, "sequence_parallel": True}))
    for k in (2, 4, 8, 16):
        pp = o.get("pp", 1) * k
        if pp <= cfg.n_layers:
            out.append(("pp", f"--pp {pp}", {"pp": pp}))
    if o.get("micro_batch", 1) > 1:
        out.append(("micro_batch", f"--micro-batch {o['micro_batch'] // 2}", {"micro_batch": o["micro_batch"] // 2}))
    return out


def what_would_fit(cfg, options: dict, allowed_bytes: float, *, most: int = 3) -> list[Change]:
    """Up to ``most`` single changes that fit (cheapest first); none: the ladder applied in turn until it
    fits (one :class:`Change` naming every flag), or as far as it goes."""
    tried = []
    for _, flags, change in _ladder(cfg, options):
        try:
            tried.append(Change(flags, training_total(cfg, options | change), allowed_bytes))
        except ValueError:  # the change is refused for this model (a degree that does not divide it)
            continue
    fitting = [c for c in tried if c.fits]
    if fitting:
        return fitting[:most]
    # kind by kind, cheapest first: the weakest setting of a kind that fits with what is chosen so far,
    # else its strongest, and on to the next kind
    kinds: dict[str, list[tuple[str, dict]]] = {}
    for kind, flags, change in _ladder(cfg, options):
        kinds.setdefault(kind, []).append((flags, change))
    combined, chosen, last = dict(options), {}, None
    for kind, steps in kinds.items():
        for flags, change in steps:
            try:
                total = training_total(cfg, combined | change)
            except ValueError:
                continue
            chosen[kind], last_change = flags, change
            last = Change(" ".join(chosen.values()), total, allowed_bytes)
            if last.fits:
                break
        if kind in chosen:
            combined |= last_change
        if last is not None and last.fits:
            break
    return [last] if last else []


def layout_variants(lay) -> list[tuple[str, object]]:
    """``plan --layout``'s single changes, cheapest first: recomputation, a higher ZeRO stage, half the
    micro-batch (twice the micro-batches)."""
    from dataclasses import replace

    out = [(f"recompute={m}", replace(lay, recompute=m)) for m in MODES[MODES.index(lay.recompute) + 1 :]]
    if lay.dp > 1:
        out += [(f"zero={z}", replace(lay, zero=z)) for z in range(lay.zero + 1, 4)]
    if lay.micro_batch > 1:
        b = lay.micro_batch // 2
        out.append((f"b={b} m={lay.microbatches * 2}", replace(lay, micro_batch=b, microbatches=lay.microbatches * 2)))
    return out
