"""The reshard matrix (issue 42): a hybrid run saved after 2 of 4 steps under one layout, loaded under
another on real gloo ranks, and continued; the whole run then equals the single process that never
stopped (loss of every step, parameters after the last, within ``parallel.parity``'s bounds), and
every rank of the saving layout wrote the tensor bytes ``theory.checkpoint`` predicts, to the byte.
Where the layout is unchanged the resumed run is bit-identical to the uninterrupted one on the same ranks."""

import pytest
import torch

from playbook.cluster import Ranks
from playbook.dims import ParallelDims as D
from playbook.parallel.hybrid.resume import save_then_resume
from playbook.parallel.hybrid import moe as hybrid_moe
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.parity import assert_parity
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup
from playbook.theory.hybrid.plan import Plan

DENSE, MOE, TIED = (
    TrainSetup(steps=4),
    TrainSetup(model="gpt-tiny-moe", steps=4),
    TrainSetup(model="gpt-tiny-tied", steps=4),
)
SP = dict(sequence_parallel=True)
MATRIX = [  # (name, setup, saved under, loaded under)
    ("dp2xtp2 z1 -> tp2xpp2", DENSE, Plan(D(dp=2, tp=2), zero=1), Plan(D(tp=2, pp=2))),
    ("dp2xpp2 z3 -> dp4", DENSE, Plan(D(dp=2, pp=2), zero=3), Plan(D(dp=4))),
    ("tp2xcp2 -> dp2xpp2 interleaved", DENSE, Plan(D(tp=2, cp=2)), Plan(D(dp=2, pp=2), schedule="interleaved")),
    ("moe dp2xep2 -> ep1", MOE, Plan(D(dp=2, ep=2)), Plan(D(dp=2))),
    ("moe dp4xep2 z1 -> dp2xep2 z3", MOE, Plan(D(dp=4, ep=2), zero=1), Plan(D(dp=2, ep=2), zero=3)),
    ("dp4 z2 -> dp2", DENSE, Plan(D(dp=4), zero=2), Plan(D(dp=2))),
    ("dp2xcp2 z2 -> tp2 sp", DENSE, Plan(D(dp=2, cp=2), zero=2), Plan(D(tp=2), **SP)),
    (
        "pp2 interleaved z1 dp2 -> dp2xtp2 z3",
        DENSE,
        Plan(D(dp=2, pp=2), zero=1, schedule="interleaved"),
        Plan(D(dp=2, tp=2), zero=3),
    ),
    ("tied pp2 -> dp2 z3", TIED, Plan(D(pp=2)), Plan(D(dp=2), zero=3)),
    ("tied dp2 z2 -> pp2 zb-v", TIED, Plan(D(dp=2), zero=2), Plan(D(pp=2), schedule="zb-v")),
    (
        "16 ranks dp2xtp2xpp2xcp2 z1 sp -> dp2xtp2 z2",
        DENSE,
        Plan(D(dp=2, tp=2, pp=2, cp=2), zero=1, **SP),
        Plan(D(dp=2, tp=2), zero=2),
    ),
]
SAME = [  # unchanged layouts: bit-identical to the run that never stopped
    ("dp2 z0", DENSE, Plan(D(dp=2))),
    ("dp2xpp2 z3", DENSE, Plan(D(dp=2, pp=2), zero=3)),
    ("moe dp2xep2 tp2 z1", MOE, Plan(D(dp=2, tp=2, ep=2), zero=1)),
]


def _reads_as_predicted(out):
    """Every loading rank's read items, bytes kept and stored-chunk bytes read, as ``theory.checkpoint.reads``
    predicts; and what the file reader read around them (framing) is more than the tensors."""
    keys = ("asked", "read", "items")
    assert [{k: r[k] for k in keys} for r in out.read_measured] == out.read_predicted
    assert all(r["file"] > r["read"] >= r["asked"] > 0 for r in out.read_measured)


def _run(rank_sets, n):
    return rank_sets.setdefault(n, Ranks(n, backend="gloo", timeout=120)).start().run


@pytest.mark.parametrize("name, setup, a, b", MATRIX, ids=[m[0] for m in MATRIX])
def test_saved_under_one_layout_continues_under_another_as_the_run_that_never_stopped(
    rank_sets, tmp_path, name, setup, a, b
):
    a.check(setup), b.check(setup)
    out = save_then_resume(_run(rank_sets, a.dims.world), _run(rank_sets, b.dims.world), setup, a, b, 2, tmp_path)
    single, floor = hybrid_moe.reference(setup, b)
    assert len(out.result.losses) == setup.steps
    assert_parity(compare(out.result, single), setup, name, floor=floor)
    assert out.measured == out.predicted, (out.measured, out.predicted)
    _reads_as_predicted(out)
    assert all(f > m for f, m in zip(out.files, out.measured))  # torch.save framing around each piece
    assert sum(out.measured) > 0


@pytest.mark.parametrize("name, setup, plan", SAME, ids=[s[0] for s in SAME])
def test_the_same_layout_resumes_bit_identical(rank_sets, tmp_path, name, setup, plan):
    run = _run(rank_sets, plan.dims.world)
    out = save_then_resume(run, run, setup, plan, plan, 2, tmp_path)
    whole = merge(run(train_hybrid, setup, plan), plan.dims.tp)
    assert out.result.losses == whole.losses
    for n, p in whole.params.items():
        assert torch.equal(out.result.params[n], p), n
    assert out.measured == out.predicted
    _reads_as_predicted(out)
    assert all(r["read"] == r["asked"] for r in out.read_measured)  # the same layout reads its own chunks whole
