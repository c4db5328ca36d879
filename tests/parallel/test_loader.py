"""A real DataLoader on each rank (``parallel.loader``): the same batches as without it (parity),
a slow one visible as an "input wait" span before the step, and its position saved and restored."""

import pytest
import torch

from playbook.dims import ParallelDims
from playbook.measure.steps import INPUT_WAIT
from playbook.parallel.hybrid.conditions import Conditions
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.loader import RankLoader
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup, train
from playbook.theory.hybrid.plan import Plan

SETUP = TrainSetup(steps=4)
DP2 = Plan(ParallelDims(dp=2))


def _run(ranks, conditions):
    return ranks.run(train_hybrid, SETUP, DP2, conditions)


@pytest.mark.parametrize(
    "conditions",
    [Conditions(loader_workers=2, prefetch=3, loader_delay_ms=5), Conditions(loader_workers=0, loader_delay_ms=1)],
    ids=["2 workers, prefetch 3", "in the rank"],
)
def test_training_with_the_loader_equals_training_without_it(ranks2, conditions):
    plain, loaded = _run(ranks2, Conditions()), _run(ranks2, conditions)
    for a, b in zip(plain, loaded):
        assert a["result"].losses == b["result"].losses
        for name, p in a["result"].params.items():
            assert torch.equal(p, b["result"].params[name]), name
    assert compare(merge(loaded, 1), train(SETUP))["max_abs_loss_diff"] < 1e-5  # and the single process


def test_a_slow_loader_is_an_input_wait_before_every_step(ranks2):
    # in the rank (no worker), each batch waits its whole delay: a lower bound whatever the load
    answers = _run(ranks2, Conditions(loader_workers=0, loader_delay_ms=60))
    for a in answers:
        assert len(a["steps"]) == SETUP.steps
        assert all(r["input_wait"] >= 0.06 for r in a["steps"]), a["steps"]
        assert all(r["seconds"] >= r["input_wait"] + r["step_s"] - 1e-9 for r in a["steps"])
    waits = [s for s in ranks2.last_trace if s["name"] == INPUT_WAIT]  # on the measured timeline, per rank
    assert sorted(s["rank"] for s in waits) == [0] * SETUP.steps + [1] * SETUP.steps
    assert all(r["input_wait"] == 0 for a in _run(ranks2, Conditions()) for r in a["steps"])  # no loader: no wait


def _make(step):
    return torch.full((2, 3), step), torch.full((2, 3), -step)


def test_the_position_is_saved_and_restored():
    loader = RankLoader(_make, 8, workers=2, prefetch=2)
    seen = [loader(k)[0][0, 0].item() for k in range(3)]
    state = loader.state_dict()
    loader.close()
    assert seen == [0, 1, 2] and state == {"next_step": 3, "workers": 2, "prefetch": 2}
    again = RankLoader(_make, 8, workers=1)
    again.load_state_dict(state)
    assert again.state_dict()["next_step"] == 3
    assert again(3)[1][0, 0].item() == -3 and again(4)[0][0, 0].item() == 4
    assert again(6)[0][0, 0].item() == 6  # another step: the iterator is repositioned there
    again.close()
    with pytest.raises(ValueError, match="next_step must be a step in 0..8"):
        again.load_state_dict({"next_step": 9})


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(workers=-1), "--loader-workers must be an integer in 0..64"),
        (dict(workers=0, prefetch=2), "--prefetch 2 is batches kept ahead by each worker"),
        (dict(workers=1, prefetch=0), "--prefetch must be an integer in 1..64"),
        (dict(workers=1, delay_s=-0.001), "--loader-delay-ms must be between 0 and 60000"),
    ],
)
def test_bad_loader_options_are_one_line(kwargs, words):
    with pytest.raises(ValueError, match=words) as err:
        RankLoader(_make, 4, **kwargs)
    assert "\n" not in str(err.value)
