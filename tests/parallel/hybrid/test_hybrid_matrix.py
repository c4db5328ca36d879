"""The composition matrix of ``playbook run hybrid`` (issue 26), in one place.

MATRIX gathers every layout list the rank tests of tests/test_hybrid*.py parametrize over; each of
those layouts runs on real ranks through ``hybrid_matrix.check``: against the single process on the
same global batch (loss, every gradient, parameters after 3 AdamW steps), bytes per rank per step on
every mesh axis measured == predicted, memory per category of every rank measured == predicted to
the byte. The fast test below (no ranks) takes every pair of ``hybrid_matrix.FEATURES``, builds
the smallest layout with both (``smallest``) and asks ``theory.hybrid.composition.refusal``: every pair it
accepts is switched on together by some layout of MATRIX (but the NOT_YET pairs, each with what
is missing), and the pairs it refuses are REFUSED, with the words of its line. PAIRS holds the
layouts that cover a pair no other test needed; they run here, on 2 and 4 ranks.
"""

import itertools
from dataclasses import dataclass

import pytest
import test_hybrid
import test_hybrid16
import test_hybrid_accumulation
import test_hybrid_moe
import test_hybrid_moe_recompute
import test_hybrid_moe_split
import test_hybrid_recompute
import test_hybrid_tied
import test_hybrid_virtual
import test_hybrid_zero
from hybrid_matrix import DENSE, FEATURES, MOE, TIED, check, features

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.training import TrainSetup
from playbook.theory.hybrid.composition import refusal


@dataclass(frozen=True)
class TiedMoE(TrainSetup):
    """gpt-tiny-moe with its head tied to its embedding: no preset (no published MoE ties them)."""

    def config(self):
        return super().config().replace(tie_embeddings=True)


TIED_MOE = TiedMoE(model="gpt-tiny-moe")
PAIRS = [  # (name, setup, plan): each the smallest layout that switches on a pair nothing else does
    (
        "ZeRO-2 over dp×cp in dp2×cp2, selective recompute, m=2",
        DENSE,
        Plan(ParallelDims(dp=2, cp=2), zero=2, recompute="selective", microbatches=2),
    ),
    (
        "ZeRO-2 interleaved in dp2×pp2, full recompute",
        DENSE,
        Plan(ParallelDims(dp=2, pp=2), zero=2, schedule="interleaved", recompute="full"),
    ),
    (
        "tied ZeRO-1 over cp in cp2×pp2, selective recompute",
        TIED,
        Plan(ParallelDims(cp=2, pp=2), zero=1, recompute="selective"),
    ),
    (
        "tied ZeRO-1 in dp2, m=2, full recompute",
        TIED,
        Plan(ParallelDims(dp=2), zero=1, microbatches=2, recompute="full"),
    ),
    ("tied ZeRO-3 in dp2, selective recompute", TIED, Plan(ParallelDims(dp=2), zero=3, recompute="selective")),
    ("tied MoE dp2×pp2×ep2", TIED_MOE, Plan(ParallelDims(dp=2, pp=2, ep=2))),
]


def rows(layouts, setup: TrainSetup | None = None) -> list[tuple[str, TrainSetup, Plan]]:
    """A test file's list as (name, setup, plan): its rows hold a Plan (or ParallelDims and the Plan's
    options), and a TrainSetup unless the whole list shares ``setup``."""
    out = []
    for row in layouts:
        row = row if isinstance(row, tuple) else (row,)
        plan = next((x for x in row if isinstance(x, Plan)), None)
        if plan is None:
            dims = next(x for x in row if isinstance(x, ParallelDims))
            plan = Plan(dims, **next(x for x in row if isinstance(x, dict)))
        name = row[0] if isinstance(row[0], str) else str(plan.dims)
        out.append((name, next((x for x in row if isinstance(x, TrainSetup)), setup), plan))
    return out


MATRIX = [
    *rows(test_hybrid.FOUR + test_hybrid.EIGHT),
    *rows(test_hybrid16.SIXTEEN),
    *rows(test_hybrid_moe.IN_PIPELINE + test_hybrid_moe.UNDER_CP + test_hybrid_moe.WITH_TP, MOE),
    *rows(test_hybrid_moe.EIGHT + test_hybrid_moe.ZERO_WITH_MOE, MOE),
    *rows(test_hybrid_moe.CHUNKED),
    *rows(test_hybrid_moe_recompute.CASES, MOE),
    *rows(test_hybrid_moe_split.CASES),
    *rows(test_hybrid_zero.TWO + test_hybrid_zero.FOUR + test_hybrid_zero.EIGHT + test_hybrid_zero.PIPELINE),
    *rows(test_hybrid_tied.TWO + test_hybrid_tied.FOUR + test_hybrid_tied.EIGHT, TIED),
    *rows(test_hybrid_tied.ZERO_TWO + test_hybrid_tied.ZERO_FOUR, TIED),
    *rows(test_hybrid_virtual.LAYOUTS, test_hybrid_virtual.SETUP),
    *rows(test_hybrid_virtual.UNEVEN_LAYOUTS, test_hybrid_virtual.UNEVEN),
    *rows(test_hybrid_recompute.CASES + test_hybrid_recompute.EIGHT, DENSE),
    *rows(test_hybrid_accumulation.CASES),
    *rows(PAIRS),
]

# What one layout cannot hold at once, by definition: one ZeRO stage, one recompute mode, a
# pipeline or none.
EXCLUSIVE = [
    {"zero1", "zero2", "zero3"},
    {"recompute selective", "recompute full"},
    {"m>1 at pp=1", "pp"},
    {"m>1 at pp=1", "virtual stages"},
    {"m>1 at pp=1", "split backward"},
]
# The pairs ``refusal`` refuses, and the words of its line.
REFUSED: dict = {}  # every pair refusal can be asked about composes; its rules are facts of one layout
# The pairs refusal accepts that no layout of MATRIX runs with every check yet, and why (none left:
# a line here names the gap, and PARTLY runs a layout with what is predicted).
NOT_YET: dict = {}
PARTLY: list = []
# What each feature asks of the smallest layout: degrees, the Plan's options, the model.
NEEDS = {
    "dp": ({"dp": 2}, {}),
    "tp": ({"tp": 2}, {}),
    "sp": ({"tp": 2}, {"sequence_parallel": True}),
    "pp": ({"pp": 2}, {}),
    "cp": ({"cp": 2}, {}),
    "ep": ({"ep": 2}, {}),
    "zero1": ({}, {"zero": 1}),
    "zero2": ({}, {"zero": 2}),
    "zero3": ({}, {"zero": 3}),
    "recompute selective": ({}, {"recompute": "selective"}),
    "recompute full": ({}, {"recompute": "full"}),
    "virtual stages": ({"pp": 2}, {"schedule": "interleaved", "microbatches": 2}),
    "split backward": ({"pp": 2}, {"schedule": "zb-h1", "microbatches": 2}),
    "tied embedding": ({}, {}),
    "m>1 at pp=1": ({}, {"microbatches": 2}),
}


def smallest(pair: frozenset) -> tuple[TrainSetup, Plan]:
    """(setup, Plan) of the smallest layout that switches on both features of ``pair``: each
    feature's degrees and options (a split backward in a V: ZB-V), ep and ZeRO given data ranks."""
    degrees, options = {}, {}
    for f in sorted(pair):
        more, opts = NEEDS[f]
        degrees |= more
        options |= opts
    if pair == {"virtual stages", "split backward"}:
        options["schedule"] = "zb-v"
    if ("ep" in pair or options.get("zero")) and degrees.get("cp", 1) == 1:
        degrees["dp"] = 2  # ep borrows ranks of dp×cp; ZeRO shards over them
    setup = {(False, False): DENSE, (True, False): MOE, (False, True): TIED, (True, True): TIED_MOE}
    return setup["ep" in pair, "tied embedding" in pair], Plan(ParallelDims(**degrees), **options)


def test_every_pair_of_features_refusal_accepts_runs_in_some_layout_of_the_matrix():
    covered = {frozenset(p) for _, setup, plan in MATRIX for p in itertools.combinations(features(setup, plan), 2)}
    uncovered, refused = [], {}
    for pair in map(frozenset, itertools.combinations(FEATURES, 2)):
        if any(pair <= both for both in EXCLUSIVE):
            continue
        setup, plan = smallest(pair)
        assert pair <= features(setup, plan), (sorted(pair), plan)
        why = refusal(
            setup.config(),
            plan.dims,
            zero=plan.zero,
            sequence_parallel=plan.sequence_parallel,
            seq_len=setup.seq_len,
            cp_variant=plan.cp_variant,
        )
        if why:
            refused[pair] = why
            continue
        plan.check(setup)  # the smallest layout is one the hybrid runs
        if pair not in covered:
            uncovered.append(" × ".join(sorted(pair)))
    assert set(uncovered) == {" × ".join(sorted(p)) for p in NOT_YET}, (
        f"pairs refusal accepts that no layout of MATRIX runs: {uncovered} (known, NOT_YET: {list(NOT_YET.values())})"
    )
    partly = {frozenset(p) for _, setup, plan in PARTLY for p in itertools.combinations(features(setup, plan), 2)}
    assert set(NOT_YET) <= partly  # each gap runs, with what is predicted
    assert set(refused) == set(REFUSED), {" × ".join(sorted(p)): w for p, w in refused.items()}
    assert all(REFUSED[p] in why for p, why in refused.items())


def test_the_matrix_holds_both_production_shapes():
    """Llama 3 405B's TP·CP·PP·DP with ZeRO-1 and SP (Dubey et al. 2024, §3.3.2) and DeepSeek-V3's
    PP·EP·DP with ZeRO-1 (DeepSeek-AI 2024, §3.2), shrunk to degree 2."""
    shapes = {(setup.model, plan.dims, plan.zero, plan.sequence_parallel) for _, setup, plan in MATRIX}
    assert ("gpt-tiny", ParallelDims(dp=2, tp=2, pp=2, cp=2), 1, True) in shapes
    assert ("gpt-tiny-moe", ParallelDims(dp=4, pp=2, ep=2), 1, False) in shapes


def test_no_layout_of_the_matrix_runs_twice():
    """Each real-rank layout (setup and plan) is in one list only: a second copy costs its ranks'
    minutes and checks nothing more (``check`` is the same everywhere)."""
    seen: dict = {}
    for name, setup, plan in MATRIX:
        seen.setdefault((setup, plan), []).append(name)
    assert not [names for names in seen.values() if len(names) > 1]


def test_every_layout_of_the_matrix_passes_the_check_before_ranks_start():
    for _, setup, plan in MATRIX:
        plan.check(setup)


@pytest.mark.parametrize("name, setup, plan", PAIRS, ids=[c[0] for c in PAIRS])
def test_the_pairs_no_other_layout_covers_match_the_single_process(request, name, setup, plan):
    check(request.getfixturevalue(f"ranks{plan.dims.world}"), setup, plan)
