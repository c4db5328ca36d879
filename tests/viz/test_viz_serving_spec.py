"""Chapter 7's speculative decoding figures: every series drawn from its rows."""

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving import batch_curves
from playbook.viz.serving_spec import acceptance_and_speedup, batch_crossover


def test_acceptance_and_speedup_draws_measured_beside_predicted():
    rows = [
        {"k": k, "acceptance_rate": 0.8 - 0.1 * k, "tokens_per_verify": 1 + 0.7 * k, "tokens_per_verify_from_alpha": 1 + 0.75 * k,
         "speedup_measured": 1.1, "speedup_predicted": 1.3}
        for k in (1, 2, 4)
    ]  # fmt: skip
    fig = acceptance_and_speedup(rows, title="t")
    assert len(fig.data) == 5
    assert list(fig.data[0].y) == [r["acceptance_rate"] for r in rows]
    assert list(fig.data[4].y) == [1.3, 1.3, 1.3]


def test_batch_crossover_marks_where_each_k_stops_paying():
    big, small, hw = (
        ModelConfig.preset("llama-3.1-70b"),
        ModelConfig.preset("llama-3.1-8b"),
        Hardware.preset("h100-sxm"),
    )
    rows, cross = batch_curves(
        big, hw, draft=small, alpha=0.8, ks=(1, 4), batches=[1, 16, 256, 1024], context=2048, tp=8
    )
    fig = batch_crossover(rows, cross, title="t")
    marks = [t for t in fig.data if t.mode == "markers+text"]
    assert [m.x[0] for m in marks] == [cross[1], cross[4]] and all(m.y[0] == 1 for m in marks)
