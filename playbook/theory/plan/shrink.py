"""Shrink a planned layout to the teaching model on a few local ranks, and predict that small run.

The planner (``playbook.theory.plan.planner``) ranks layouts of a big model on many GPUs by formulas
that no laptop can check at their size. What a laptop can check is the *shape*: the same axes,
in the same order (tp fastest, then cp, dp, pp; ``playbook.dims``), composed the same way, on the
teaching model (``gpt-tiny``, or ``gpt-tiny-moe`` for a mixture of experts), with every byte sent
and held predicted by ``playbook.theory.hybrid.hybrid`` — the functions ``playbook run hybrid`` is checked
against to the byte. This is how Megatron-LM's scaling study validated its performance model on
small configurations before the large ones (Narayanan et al. 2021, arXiv:2104.04473, §5).

The rules (each change is written into ``Shrunk.notes`` with its reason):

- every axis > 1 is kept at degree 2, the smallest that keeps its groups and collectives (a ring
  of two, a pipeline of two stages); ``gpt-tiny`` has 2 KV heads and 2 layers, so tp ≤ 2, pp ≤ 2;
  ep (which borrows ranks from dp·cp) is kept at 2 of ``gpt-tiny-moe``'s 4 experts;
- k kept axes need 2**k ranks (ep adds none): more than ``max_ranks`` is refused;
- what ``playbook run hybrid`` refuses (``theory.hybrid.composition``, the one table it checks too) is
  refused here, unless the caller names an axis to leave out (``drop``);
- the ZeRO stage is kept (dense units over dp×cp, routed experts over their replicas), except none
  where dp·cp = 1 (nothing to shard over); sequence parallelism (the planner assumes it with every
  tp > 1) is kept with tp;
- a pipeline runs m = 2·pp micro-batches (m ≥ pp fills 1F1B, as the candidate's m does; a multiple
  of pp for interleaved, m ≥ 2·pp for DualPipe-V) under the candidate's schedule, interleaved with
  v = 2 chunks (2 stages × 2 chunks place gpt-tiny's 4 pieces one each); without a pipeline one
  micro-batch per step; two rows of 32 tokens per micro-batch;
- the candidate's activation recomputation is replayed (Korthikanti et al. 2022: selective keeps
  q, k, v and reruns the attention core; full reruns each block), or the next lighter mode that
  ``playbook run hybrid`` composes in the shrunk layout (full → selective → none), asking the one
  table at run time, so the shrinker follows it as it changes;
- our runs are fp32: the planner's bf16 bytes are not replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.hybrid.composition import refusal
from playbook.theory.hybrid.hybrid import comm_per_axis, memory_per_rank
from playbook.theory.plan.search import Candidate, Layout, Plan

SMALL = {False: "gpt-tiny", True: "gpt-tiny-moe"}
SEQ_LEN, ROWS = 32, 2  # tokens per sequence and rows per micro-batch of the replay
AXES = ("dp", "tp", "pp", "cp", "ep")
WHY_TWO = {
    "tp": "{model} has 2 KV heads, and 2 keeps tp's all-reduces",
    "pp": "{model} has 2 layers: 2 stages of one layer",
    "dp": "2 replicas keep the gradient all-reduce",
    "cp": "2 ranks keep the ring's K/V passes",
    "ep": "2 of {model}'s 4 experts per rank keep the all-to-alls",
}


@dataclass(frozen=True)
class Shrunk:
    """A planner candidate at laptop size: the layout to run, and what changed and why."""

    source: Layout
    model: str
    dims: ParallelDims
    zero: int = 0
    sequence_parallel: bool = False
    microbatches: int | None = None  # None: no pipeline
    global_batch: int = ROWS
    seq_len: int = SEQ_LEN
    notes: tuple[str, ...] = field(default_factory=tuple)
    schedule: str = "1f1b"
    virtual_stages: int = 1  # chunks per pipeline rank: 2 for interleaved and the V shapes
    recompute: str = "none"  # activation recomputation: none, selective, full (``parallel.hybrid.recompute``)

    @property
    def m(self) -> int:
        return self.microbatches or 1

    def __str__(self) -> str:
        extra = [f"ZeRO-{self.zero}"] * bool(self.zero) + ["SP"] * self.sequence_parallel
        extra += [f"m{self.microbatches}"] if self.microbatches else []
        extra += [f"recompute={self.recompute}"] if self.recompute != "none" else []
        return f"{self.dims} {' '.join(extra)}".strip() + f" on {self.model}"

    def command(self) -> str:
        """The ``playbook run hybrid`` line of this replay."""
        flags = [f"--{a} {getattr(self.dims, a)}" for a in AXES if getattr(self.dims, a) > 1 or a == "dp"]
        flags += [f"--zero {self.zero}"] * bool(self.zero) + ["--sequence-parallel"] * self.sequence_parallel
        flags += [f"--microbatches {self.microbatches}"] if self.microbatches else []
        flags += [f"--schedule {self.schedule}"] if self.schedule != "1f1b" else []
        flags += [f"--chunks {self.virtual_stages}"] if self.schedule == "interleaved" else []
        flags += [f"--recompute {self.recompute}"] if self.recompute != "none" else []
        return (
            f"playbook run hybrid --model {self.model} {' '.join(flags)} "
            f"--global-batch {self.global_batch} --seq-len {self.seq_len}"
        )

    def predict(self, routing: list | None = None) -> list[dict]:
        """Per rank: ``{rank, coords, bytes, memory}``, bytes sent per step by axis and bytes held by
        category, from ``theory.hybrid.hybrid`` (a mixture of experts' all-to-all bytes and activations
        depend on the routing: give the run's, or they are missing / None)."""
        cfg = ModelConfig.preset(self.model)
        rows = []
        for r in range(self.dims.world):
            where = dict(
                rank=r,
                global_batch=self.global_batch,
                seq_len=self.seq_len,
                sequence_parallel=self.sequence_parallel,
                microbatches=self.m,
                zero=self.zero,
                schedule=self.schedule,
                virtual_stages=self.virtual_stages,
                recompute=self.recompute,
            )
            rows.append(
                {
                    "rank": r,
                    "coords": self.dims.coords(r),
                    "bytes": comm_per_axis(cfg, self.dims, routing=routing, **where),
                    "memory": memory_per_rank(cfg, self.dims, routing=routing[0] if routing else None, **where),
                }
            )
        return rows


def _refuse(lay: Layout, why: str, fix: str) -> ValueError:
    return ValueError(f"{lay} cannot be shrunk: {why}; {fix}")


def shrink(
    candidate: Candidate | Layout,
    *,
    model: ModelConfig | None = None,
    drop: tuple[str, ...] = (),
    max_ranks: int = 8,
) -> Shrunk:
    """The same layout shape on ``gpt-tiny`` (``gpt-tiny-moe`` if ``model`` has experts) on at most
    ``max_ranks`` ranks (module docstring). ``model``: the planned model, named in the notes.
    ``drop``: axes to leave out, when the hybrid does not compose them with the others.
    Raises one ``ValueError`` naming the constraint and what would work."""
    lay = candidate.layout if isinstance(candidate, Candidate) else candidate
    moe = bool(model and model.is_moe) or lay.ep > 1
    small = SMALL[moe]
    big = model.name if model else "the planned model"
    unknown = [a for a in drop if a not in AXES]
    if unknown:
        raise _refuse(lay, f"drop={unknown} names no axis", f"name some of {', '.join(AXES)}")
    kept = {a: v for a, v in lay.degrees.items() if v > 1 and a not in drop}
    notes = [f"{a}{lay.degrees[a]} left out, as asked (drop)" for a in drop if lay.degrees[a] > 1]
    if "ep" in kept and "dp" not in kept and "cp" not in kept:
        raise _refuse(lay, "ep borrows ranks from dp·cp, and none is left", "keep dp or cp, or drop ep too")
    ranked = [a for a in kept if a != "ep"]
    if 2 ** len(ranked) > max_ranks:
        raise _refuse(
            lay,
            f"{len(ranked)} axes > 1 need 2^{len(ranked)} = {2 ** len(ranked)} ranks at degree 2, over max_ranks={max_ranks}",
            f"raise max_ranks to {2 ** len(ranked)} or drop an axis",
        )
    degrees = {a: 2 if a in kept else 1 for a in AXES}
    for a, v in kept.items():
        if v > 2:
            notes.append(f"{a} {v} → 2: {WHY_TWO[a].format(model=small)}")
    dims = ParallelDims(**degrees)
    zero, sp = _zero_and_sp(lay.zero, dims, notes)
    m = 2 * dims.pp if dims.pp > 1 else None
    schedule, v = (lay.schedule, 2 if lay.v > 1 else 1) if m else ("1f1b", 1)
    if m:
        notes.append(f"micro-batches {lay.microbatches} → {m}: m ≥ pp fills the 1F1B pipeline")
    if m and lay.v > 2:
        notes.append(f"{lay.schedule} v {lay.v} → 2: 2 stages × 2 chunks place {small}'s 4 pieces one each")
    elif not m and lay.microbatches > 1:
        notes.append(f"gradient accumulation over {lay.microbatches} micro-batches → one micro-batch per step")
    cfg, layout = (
        ModelConfig.preset(small),
        dict(zero=zero, sequence_parallel=sp, seq_len=SEQ_LEN),
    )
    recompute = lay.recompute  # every mode composes with every layout (``theory.hybrid.composition``)
    why = refusal(cfg, dims, **layout)
    if why:  # the hybrid's own table: what it refuses, the replay cannot run
        raise _refuse(lay, why, "leave an axis out (drop=...) or shrink a candidate without it")
    notes.append(f"{big} → {small}; {ROWS} rows of {SEQ_LEN} tokens per micro-batch, fp32 (the plan counts bf16)")
    batch = dims.dp * (m or 1) * ROWS
    return Shrunk(lay, small, dims, zero, sp, m, batch, SEQ_LEN, tuple(notes), schedule, v, recompute)


def _zero_and_sp(zero: int, dims: ParallelDims, notes: list) -> tuple[int, bool]:
    """The ZeRO stage and sequence parallelism of the replay (``playbook run hybrid``'s rules, the
    module docstring): SP with every tp > 1, ZeRO over dp×cp where it has ranks to shard over."""
    sp = dims.tp > 1
    if zero and dims.dp * dims.cp == 1:
        notes.append(f"ZeRO-{zero} → 0: dp·cp = 1 here, no replicas to shard over")
        return 0, sp
    return zero, sp


def first_shrinkable(plan: Plan, *, max_ranks: int = 8) -> tuple[int, Shrunk]:
    """The fastest of ``plan``'s candidates that shrinks with no axis left out: (its index, it)."""
    model = ModelConfig.preset(plan.model) if plan.model in ModelConfig.presets() else None
    for i, c in enumerate(plan.candidates):
        try:
            return i, shrink(c, model=model, max_ranks=max_ranks)
        except ValueError:
            continue
    raise ValueError(
        f"none of the {len(plan.candidates)} candidates shrinks to ≤ {max_ranks} ranks with every axis kept; "
        "pass drop=(...) to shrink() to leave an axis out"
    )
