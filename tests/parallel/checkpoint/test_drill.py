"""The failure drill in CI (issue 42): ``playbook run hybrid --dp 2`` under ``torchrun --max-restarts 1``,
saving every 2 steps; rank 1 is SIGKILLed after step 3; the elastic agent restarts the job, which
loads step 2's checkpoint, runs steps 3-6 again and ends with exactly the parameters of a run that
never failed (bit for bit: the same layout on the same backend), and passes its own parity check."""

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from playbook.dims import ParallelDims
from playbook.parallel.checkpoint import CheckpointPlan
from playbook.parallel.checkpoint.drill import drill
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.training import TrainSetup
from playbook.theory.hybrid.plan import Plan


def weights(folder, tmp_path, name):
    out = tmp_path / f"{name}.pt"
    dcp_to_torch_save(folder, out)
    return {k: v for k, v in torch.load(out).items() if k.startswith("model/")}


def test_a_killed_rank_is_restarted_and_the_run_ends_as_if_it_never_failed(ranks2, tmp_path):
    d = drill(tmp_path / "job", ["--dp", "2"], steps=6, save_every=2, kill_after=3)
    assert d.returncode == 0, d.stderr[-3000:]
    assert d.attempts == 2 and d.killed_at_step == 3 and d.steps_lost == 1
    assert d.restart_seconds > 0 and d.reload_seconds > 0 and d.detect_seconds < d.restart_seconds
    assert d.report["parity"]["within_bounds"] and len(d.report["losses"]) == 6
    assert d.report["checkpoint"]["loads"][0]["step"] == 2
    never = tmp_path / "never"
    ranks2.run(
        train_hybrid, TrainSetup(steps=6), Plan(ParallelDims(dp=2)), checkpoint=CheckpointPlan(save=str(never), every=2)
    )
    got, want = weights(tmp_path / "job" / "step-6", tmp_path, "got"), weights(never / "step-6", tmp_path, "want")
    assert got.keys() == want.keys() and len(got) > 0
    for k in want:
        assert torch.equal(got[k], want[k]), k
