"""The engine sections' figures: one bar per layout and series, one line per schedule, p50/p90/p99."""

from playbook.viz.serving_engine import latency_percentiles, prefix_hits, step_times


def test_figures_carry_the_numbers_they_are_given():
    rows = [{"layout": "tp2×dp4", "hit_rate": 0.6}, {"layout": "tp8×dp1", "hit_rate": 0.72}]
    fig = prefix_hits({"predicted": rows, "measured": rows[:1]})
    assert [list(b.y) for b in fig.data] == [[60.0, 72.0], [60.0]] and fig.data[0].text[1] == "72%"
    fig = step_times({"whole": [0.01, 0.05], "chunked": [0.01, 0.02]})
    assert list(fig.data[0].y) == [10.0, 50.0] and fig.data[1].name == "chunked"
    rep = {"measured": {m: {"p50": 0.001, "p90": 0.002, "p99": 0.003} for m in ("ttft", "tpot", "itl", "e2e")}}
    fig = latency_percentiles(rep)
    assert [b.name for b in fig.data] == ["p50", "p90", "p99"] and list(fig.data[2].y) == [3.0] * 4
    assert list(fig.data[2].text) == ["3"] * 4 and fig.layout.yaxis.type != "log"  # labelled bars, readable ticks


def test_chunked_and_disaggregation_figures_carry_their_numbers():
    from playbook.viz.serving_engine import chunked_p99, disagg_costs

    keys = ("tpot_measured", "tpot_predicted", "itl_measured", "itl_predicted")
    rows = [
        {"schedule": "whole", **dict(zip(keys, (0.05, 0.02, 0.2, 0.06)))},
        {"schedule": "budget", **{k: 0.01 for k in keys}},
    ]
    fig = chunked_p99(rows)
    assert [b.name for b in fig.data][::2] == ["TPOT p99 measured", "inter-token p99 measured"]
    assert list(fig.data[2].y) == [200.0, 10.0] and list(fig.data[0].x) == ["whole", "budget"]
    fig = disagg_costs([{"prompt": 512, "prefill": 0.016, "NVLink": 0.00015}], ["NVLink"])
    assert list(fig.data[0].y) == [16.0] and list(fig.data[1].y) == [0.15] and fig.layout.yaxis.type == "log"
