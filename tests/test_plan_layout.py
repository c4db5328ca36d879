"""``playbook plan --layout``: one given layout costed by the search's own functions."""

import pytest

from playbook.config import Hardware, ModelConfig
from playbook.theory.plan_layout import cost_layout, parse_layout
from playbook.theory.planner import plan

CFG, HW = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")


def test_a_candidate_costed_alone_matches_the_search_and_ranks_where_it_sat():
    p = plan(CFG, HW, gpus=16, seq_len=4096, global_batch=64)
    for i in (0, 3):
        c = p.candidates[i]
        r = cost_layout(CFG, HW, c.layout, seq_len=4096)
        assert r["memory_total"] == pytest.approx(c.memory) and r["step"]["total"] == pytest.approx(c.cost.total)
        assert r["fits"] and r["margin_bytes"] == pytest.approx(0.9 * HW.memory_bytes - c.memory)
        assert r["rank"] == 1 + sum(x.cost.total < c.cost.total for x in p.candidates) and r["of"] == len(p.candidates)
        assert r["rank"] <= i + 1


def test_parse_layout_and_its_one_line_errors():
    lay = parse_layout("dp=4 tp=2 pp=2 zero=1 schedule=interleaved v=2", global_batch=64)
    assert (lay.dp, lay.tp, lay.pp, lay.microbatches, lay.schedule, lay.v) == (4, 2, 2, 16, "interleaved", 2)
    with pytest.raises(ValueError, match="key=value"):
        parse_layout("dp=4 bogus", global_batch=64)
    with pytest.raises(ValueError, match="does not split"):
        parse_layout("dp=3", global_batch=64)


def test_cli_layout_says_whether_it_fits(capsys):
    from playbook.cli import main

    argv = ["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64"]
    assert main([*argv, "--layout", "dp=4 tp=2 pp=2 zero=1"]) == 0
    out = capsys.readouterr().out
    assert "fits, margin" in out and "rank" in out and "production activations" in out
    assert main([*argv, "--layout", "dp=2 tp=2 pp=2"]) == 2  # 8 GPUs, not 16
    assert "try --gpus 8" in capsys.readouterr().err
