"""The planner's tp collectives against ``theory.tp.step_collectives``, the count the shrunk replays
measure on real ranks (chapter 8b §2): one number from two sources, compared on a shrunk layout."""

import pytest

from playbook.config import ModelConfig
from playbook.theory.comm import sent_bytes
from playbook.theory.plan_cost import TP_COLLECTIVES_PER_LAYER
from playbook.theory.tp import layer_summary, step_collectives


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
