"""The hybrid chapter's dashboard, driven by setting its widgets' values: every control moves a
figure or says why it cannot, a refused layout shows its constraint, and the button overlays a run."""

import pytest

from playbook.parallel.training import TrainSetup
from playbook.viz.mesh_dashboard import hybrid_dashboard
from playbook.viz.widgets import STALE

SETUP = TrainSetup(model="gpt-tiny", steps=1, global_batch=8, seq_len=32)


def data(box) -> tuple:
    """Everything the three figures draw, as plain values."""
    out = []
    for name, fig in box.figures.items():
        for t in fig.data:
            values = [getattr(t, k, None) for k in ("x", "y", "z", "customdata")]
            out.append((name, t.name, getattr(t, "meta", None), repr(values)))
    return tuple(out)


def titles(box) -> list[str]:
    return [fig.layout.title.text or "" for fig in box.figures.values()]


def pick(box, **values) -> None:
    for k, v in values.items():
        box.controls[k].value = v


@pytest.fixture
def box():
    return hybrid_dashboard(None, SETUP)


def test_starts_valid_with_the_chapter_layout(box):
    assert box.message.value == ""
    assert [t.meta for t in box.figures["bytes"].data] == ["tp", "dp", "pp"]
    assert {t.name for t in box.figures["bytes"].data} == {"predicted"}
    assert len(box.figures["memory"].data) == 4  # params, grads, optimizer, activations
    assert not any(STALE in t for t in titles(box))


@pytest.mark.parametrize(("degree", "value"), [("dp", 4), ("tp", 1), ("pp", 4), ("cp", 2)])
def test_each_degree_alone_breaks_the_product_and_says_so(box, degree, value):
    before = data(box)
    pick(box, **{degree: value})
    assert "must multiply to the 8 ranks" in box.message.value
    assert data(box) == before  # the last valid layout stays drawn ...
    assert all(STALE in t for t in titles(box))  # ... and says it is stale
    assert box.button.disabled


@pytest.mark.parametrize(
    "moves",
    [
        dict(pp=1, dp=4),  # dp2·tp2·pp2 -> dp4·tp2
        dict(tp=1, dp=4),  # -> dp4·pp2
        dict(pp=1, cp=2),  # -> dp2·tp2·cp2
        dict(tp=1, pp=1, dp=8),  # -> dp8
    ],
)
def test_degree_moves_that_keep_8_ranks_redraw(box, moves):
    before = data(box)
    pick(box, **moves)
    assert box.message.value == ""
    assert data(box) != before
    assert not any(STALE in t for t in titles(box))


def test_model_ep_sequence_parallel_and_zero_each_move_a_figure_or_explain(box):
    pick(box, tp=1, pp=1, dp=8)
    before = data(box)
    pick(box, model="gpt-tiny-moe")  # the experts' parameters
    assert data(box) != before and "routing" in box.notes.value
    before = data(box)
    pick(box, ep=2)  # the expert replicas' all-reduce appears, the grid gains its ep groups
    assert data(box) != before
    assert "ep_replica" in [t.meta for t in box.figures["bytes"].data]
    assert "ep" in [t.name for t in box.figures["grid"].data]
    pick(box, model="gpt-tiny")
    assert "mixture-of-experts" in box.message.value
    pick(box, ep=1, dp=4, tp=2)
    assert box.message.value == ""
    before = data(box)
    pick(box, sequence_parallel=True)  # the norms' and the residual's activations split over tp
    assert box.message.value == "" and data(box) != before
    pick(box, sequence_parallel=False)
    before = data(box)
    pick(box, zero=1)
    assert "ZeRO-1" in box.notes.value and data(box) != before  # Adam's state sharded over dp
    pick(box, zero=2)
    assert "ZeRO-2" in box.notes.value and "same for stages 1 and 2" in box.notes.value
    pick(box, zero=3)  # parameters gathered forward and backward: more dp bytes
    assert data(box) != before
    pick(box, sequence_parallel=True)  # ZeRO-3 with SP: the norms summed over tp before the reduce-scatter
    assert box.message.value == "" and "ZeRO-3" in box.notes.value


def test_a_refused_layout_shows_the_constraint(box):
    pick(box, pp=1, tp=4)  # dp2·tp4: gpt-tiny has 2 kv heads
    assert "tp=4 must divide kv_heads=2" in box.message.value
    assert all(STALE in t for t in titles(box))
    pick(box, tp=2, pp=2, zero=3)  # dp2·tp2·pp2: ZeRO-3 inside a pipeline runs, gathered once a step
    assert box.message.value == "" and "one all-gather per step" in box.notes.value
    pick(box, zero=0)
    assert box.message.value == "" and not any(STALE in t for t in titles(box))


def test_the_button_refuses_an_invalid_layout_without_ranks():
    box = hybrid_dashboard(object(), SETUP)  # a cluster that cannot run: never called
    pick(box, dp=4)
    box.run()
    assert "valid layout first" in box.status.value


def test_the_button_overlays_a_real_run(ranks8):
    box = hybrid_dashboard(ranks8, SETUP)
    predicted = {(t.meta, tuple(t.customdata)) for t in box.figures["bytes"].data}
    box.run()
    assert "predicted == measured on 24 of 24" in box.status.value and "load average" in box.status.value
    bars = box.figures["bytes"].data
    measured = {(t.meta, tuple(t.customdata)) for t in bars if t.name == "measured"}
    assert measured == predicted  # every rank, every axis, to the byte
    names = [t.name for t in box.figures["memory"].data]
    assert "predicted total" in names  # measured bars, the prediction as diamonds
    after = data(box)
    pick(box, pp=1, dp=4)  # another layout: predictions only ...
    assert {t.name for t in box.figures["bytes"].data} == {"predicted"}
    pick(box, dp=2, pp=2)  # ... and back: the measurement is kept
    assert data(box) == after


def test_a_zero_run_overlays_its_measured_memory_on_the_prediction(ranks8):
    box = hybrid_dashboard(ranks8, SETUP)
    pick(box, pp=1, dp=4, zero=1)
    box.run()
    assert {t.name for t in box.figures["bytes"].data} == {"predicted", "measured"}
    assert any(v > 0 for t in box.figures["memory"].data for v in t.customdata)  # not empty bars
    assert "predicted total" in {t.name for t in box.figures["memory"].data}  # measured bars, predicted diamonds
    assert "measured no memory" not in box.notes.value


class FailingRanks:
    world_size = 8

    def run(self, fn, *args, **kwargs):
        raise RuntimeError("rank 0 failed: NotImplementedError: planted\nTraceback ...")


def test_a_failed_run_says_why_in_one_line():
    box = hybrid_dashboard(FailingRanks(), SETUP)
    before = data(box)
    box.run()
    assert "run failed" in box.status.value and "planted" in box.status.value and "Traceback" not in box.status.value
    assert data(box) == before


@pytest.mark.parametrize(
    "zero, says, never",
    [
        (1, "Adam's state sharded", "gradients"),
        (2, "and gradients sharded", "weights"),
        (3, "and weights sharded", None),
    ],
)
def test_the_zero_note_says_what_each_stage_shards_and_no_more(zero, says, never):
    from playbook.dims import ParallelDims
    from playbook.theory.hybrid import Plan
    from playbook.viz.mesh_dashboard import notes

    note = next(n for n in notes(SETUP, Plan(dims=ParallelDims(dp=2, tp=2), zero=zero), True) if n.startswith("ZeRO"))
    head = note.split(";")[0]
    assert says in head and (never is None or never not in head), note
