"""The planner's bytes per axis against the functions the shrunk replays verify and against a replay
on real ranks (chapter 8b §2): tp's collectives per layer against ``theory.tp.tp.step_collectives``; cp,
pp and dp (``theory.plan.axis_bytes``, what ``theory.plan.cost`` times) against ``theory.hybrid.hybrid.comm_per_axis``
and a trace measured on 8 ranks: one number from one source, compared on a shrunk layout."""

import pytest

from playbook.config import ModelConfig
from playbook.theory.cost.comm import sent_bytes
from playbook.theory.plan.cost import TP_COLLECTIVES_PER_LAYER
from playbook.theory.tp.comm import layer_summary, step_collectives


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_planner_tp_collectives_per_layer_match_the_replays(recompute):
    """gpt-tiny at tp2 with SP: every collective of a layer is an all-gather or reduce-scatter of
    one [b, s, h] activation, as the planner times them; the planner counts 8 per layer, 12 with
    Megatron's full recomputation, where our replay's non-reentrant checkpoint issues 11."""
    cfg, b, s, t, B = ModelConfig.preset("gpt-tiny"), 2, 16, 2, 4
    cols = step_collectives(cfg, seq_len=s, micro_batch=b, tp=t, sequence_parallel=True, recompute=recompute)
    summary = layer_summary(cols)
    act = b * s * cfg.hidden * B
    assert {op for _, op in summary} <= {"all_gather", "reduce_scatter"}
    assert all(c.bytes == act for c in cols if c.region.startswith("layer0."))
    count = sum(row["count"] for row in summary.values())
    assert count == TP_COLLECTIVES_PER_LAYER[recompute] - (recompute == "full")
    sent = sum(row["sent_bytes"] for row in summary.values())
    assert sent == pytest.approx(count * sent_bytes("all_gather", act, t))  # what plan_cost's ring times


# ---- cp, pp and dp: the planner's counts beside theory.hybrid and a replay -------------------------
def _big(**kw):
    from playbook.theory.plan.search import Layout

    base = dict(dp=8, tp=1, pp=1, cp=1, ep=1, zero=0, micro_batch=1, microbatches=16, recompute="none")
    return Layout(**(base | kw))


@pytest.mark.parametrize(
    "lay",
    [
        _big(cp=4, zero=1, microbatches=1),
        _big(pp=4),
        _big(pp=4, zero=1, schedule="interleaved", v=2),
        _big(dp=4, tp=2, pp=4, zero=1),
        _big(tp=4, cp=2, zero=1, microbatches=1),
        _big(pp=4, zero=1, schedule="zb-v", v=2),
    ],
    ids=str,
)
def test_planner_bytes_per_axis_are_theory_hybrids_on_a_shrunk_candidate(lay):
    """cp (ring K/V and fp32 gradients), pp (the busiest rank's sends) and dp (the most loaded stage's
    flat units, ZeRO 0 and 1; on a V rank 0 holds the embedding and the head) as ``theory.plan.cost`` counts
    them equal ``theory.hybrid.hybrid.comm_per_axis`` to the byte."""
    from playbook.theory.plan.axis_bytes import busiest, replay_bytes
    from playbook.theory.plan.shrink import shrink

    small = shrink(lay)
    planner, hybrid = replay_bytes(small), busiest([r["bytes"] for r in small.predict()])
    hybrid.pop("tp", None)  # tp: the count per layer above
    assert planner == hybrid


@pytest.mark.ranks
def test_planner_bytes_per_axis_match_the_trace_on_real_ranks():
    """dp2×pp2×cp2 ZeRO-1, interleaved, on 8 real ranks: the busiest rank's bytes on cp, pp and the
    data axis, measured, equal what the planner times (at fp32, our ranks' dtype)."""
    from playbook.parallel.hybrid.replay import replay
    from playbook.theory.plan.axis_bytes import busiest, replay_bytes
    from playbook.theory.plan.shrink import shrink

    small = shrink(_big(pp=4, cp=2, zero=1, schedule="interleaved", v=2))
    run = replay(small)
    measured = [
        {r["key"]: r["measured"] for r in run.rows if r["what"] == "bytes sent" and r["rank"] == rank}
        for rank in range(small.dims.world)
    ]
    assert run.exact and replay_bytes(small) == busiest(measured) == {"cp": 98304, "pp": 98304, "dp": 302208}
