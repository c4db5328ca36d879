"""PyTorch's native hybrid mesh (FSDP2 over dp + DTensor TP over tp, one DeviceMesh) on 4 real
ranks: against the single process on the same global batch and against ours (``train_hybrid``):
loss and every first-step gradient to 1e-5 relative, parameters after 3 AdamW steps to 1e-5
relative L2 per tensor."""

import pytest

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.hybrid.native import check_native, native_on_rank
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.parity import reference
from playbook.parallel.parity import assert_parity, bounds
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup

SETUP = TrainSetup()  # gpt-tiny, 3 AdamW steps, global batch 8, sequence 32
LAYOUTS = {
    "dp2×tp2": (ParallelDims(dp=2, tp=2), False),
    "dp2×tp2 with sequence parallelism": (ParallelDims(dp=2, tp=2), True),
    "dp4": (ParallelDims(dp=4), False),
}
_runs: dict = {}


def runs(ranks, name):
    """(native, ours, single) for one layout, run once for all tests below."""
    if name not in _runs:
        dims, sp = LAYOUTS[name]
        check_native(SETUP, dims, sequence_parallel=sp)
        native = ranks.run(native_on_rank, SETUP, dims=dims, sequence_parallel=sp, progress=False)
        ours = merge(ranks.run(train_hybrid, SETUP, Plan(dims, sequence_parallel=sp), progress=False), dims.tp)
        if "single" not in _runs:
            _runs["single"] = reference(SETUP)
        _runs[name] = native, ours, _runs["single"]
    return _runs[name]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_native_matches_the_single_process(ranks4, name):
    native, _, single = runs(ranks4, name)
    assert len(native) == 4 and len(native[0].losses) == SETUP.steps
    for r in native:  # every rank returns whole tensors, the same ones
        assert r.params.keys() == single.params.keys()
        assert_parity(compare(r, single), SETUP)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_native_matches_ours(ranks4, name):
    native, ours, _ = runs(ranks4, name)
    assert_parity(compare(ours, native[0]), SETUP)  # two float32 runs


@pytest.mark.parametrize(
    "dims, model, words",
    [
        (ParallelDims(dp=2, pp=2), "gpt-tiny", "dp × tp only.*same 4 ranks try dp=4 tp=1, dp=2 tp=2"),
        (ParallelDims(tp=2, cp=2), "gpt-tiny", "dp × tp only"),
        (ParallelDims(dp=4, ep=2), "gpt-tiny-moe", "dp × tp only"),
        (ParallelDims(dp=2), "gpt-tiny-moe", "dense preset"),
        (ParallelDims(dp=3), "gpt-tiny", "global_batch=8"),
        (ParallelDims(tp=4), "gpt-tiny", "kv_heads=2"),
    ],
)
def test_bad_layouts_are_refused_in_one_line_before_ranks_start(dims, model, words):
    with pytest.raises(ValueError, match=words) as e:
        check_native(TrainSetup(model=model), dims)
    assert "\n" not in str(e.value)


def test_playbook_run_hybrid_native_reports_both_parities(capsys):
    import json

    from playbook.cli import main

    assert main(["run", "hybrid", "--dp", "2", "--tp", "2", "--native", "--steps", "2", "--json"]) == 0
    native = json.loads(capsys.readouterr().out)["native"]
    limit = bounds(TrainSetup(steps=2))["max_rel_grad_diff"]
    assert native["max_rel_grad_diff"] <= limit and native["single"]["max_rel_grad_diff"] <= limit
    assert main(["run", "hybrid", "--dp", "2", "--pp", "2", "--native"]) == 2  # refused before ranks start
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
