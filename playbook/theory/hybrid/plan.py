"""The hybrid's layout options: a ``ParallelDims`` and which variant of each strategy (``Plan``). Pure:
the runtime (``parallel.hybrid``), the dashboards and the shrinker read the same value, and
``Plan.check`` is every constraint of a layout before any rank starts (the one composition table,
``theory.hybrid.composition``; the schedule's, ``theory.pp.schedules.check_pipeline``). No torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from playbook.dims import ParallelDims
from playbook.theory.cp import VARIANTS as CP_VARIANTS
from playbook.theory.hybrid.composition import refusal
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.theory.pp.schedules import check_pipeline, chunks_per_rank


@dataclass(frozen=True)
class Plan:
    """Everything about a layout beyond its degrees: which variant of each strategy."""

    dims: ParallelDims
    zero: int = 0
    sequence_parallel: bool = False
    cp_variant: str = "ring"
    zigzag: bool = False
    schedule: str = "1f1b"
    microbatches: int | None = None  # None: as many as pipeline stages
    virtual_stages: int | None = None  # model chunks per pp rank; None: 2 for interleaved and the V shapes, else 1
    recompute: str = "none"  # activation recomputation: none, selective, full (``parallel.hybrid.recompute``)
    max_norm: float | None = None  # clip by the global gradient norm (``parallel.clip``); None: no clipping

    @property
    def m(self) -> int:
        return self.microbatches or (self.dims.pp if self.dims.pp > 1 else 1)

    @property
    def played_schedule(self) -> str:
        """The schedule the driver plays: ``schedule``, or at pp = 1 1F1B of one stage (F₀ B₀ F₁ B₁ …:
        gradient accumulation over the m micro-batches)."""
        return self.schedule if self.dims.pp > 1 else "1f1b"

    @property
    def v(self) -> int:
        """Chunks per pipeline rank: interleaved 1F1B's v (Narayanan et al. 2021, §2.2.2), 2 for the V
        shapes ZB-V and DualPipe-V (rank 0 holds the first and the last stage), 1 otherwise."""
        if self.dims.pp == 1:
            return 1
        return self.virtual_stages or chunks_per_rank(self.schedule, 2)

    def as_dict(self) -> dict:
        return {**asdict(self), "dims": asdict(self.dims)}

    def check(self, setup) -> None:
        """Every constraint, before any rank starts: one ``ValueError`` naming it and what would work.
        ``setup`` is a ``parallel.training.TrainSetup`` (its ``config()``, ``seq_len``, ``global_batch``)."""
        cfg, d = setup.config(), self.dims
        d.check(
            cfg,
            seq_len=setup.seq_len,
            global_batch=setup.global_batch,
            zigzag=self.zigzag,
            microbatches=self.m if self.m > 1 else None,
        )
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.virtual_stages not in (None, 1) and d.pp == 1:
            raise ValueError(
                f"virtual_stages={self.virtual_stages} chunks a pipeline, and pp=1 in {d}: add pp or drop it"
            )
        if self.max_norm is not None and not self.max_norm > 0:
            raise ValueError(f"max_norm must be a positive number (or None: no clipping), got {self.max_norm!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")
        if self.cp_variant not in CP_VARIANTS:
            raise ValueError(f"cp_variant must be one of {', '.join(CP_VARIANTS)}, got {self.cp_variant!r}")
        why = refusal(
            cfg,
            d,
            zero=self.zero,
            sequence_parallel=self.sequence_parallel,
            seq_len=setup.seq_len,
            cp_variant=self.cp_variant,
        )
        if why:  # the one composition table (``theory.hybrid.composition``), which the shrinker reads too
            raise ValueError(why)
        if d.pp > 1:
            # stages need not be equal: executor and theory cut the same pieces (``theory.pp.pipeline.stage_ranges``)
            check_pipeline(d.pp, self.m, self.v, name=self.schedule, n_layers=cfg.n_layers)
