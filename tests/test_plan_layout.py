"""``playbook plan --layout``: one given layout costed by the search's own functions."""

import dataclasses

import pytest

from playbook.config import Hardware, ModelConfig
from playbook.theory.plan_layout import cost_layout, parse_layout
from playbook.theory.plan_memory import memory_breakdown
from playbook.theory.prod_activations import production_block_bytes
from playbook.theory.planner import plan

CFG, HW = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")


def test_a_candidate_costed_alone_matches_the_search_and_ranks_where_it_sat():
    p = plan(CFG, HW, gpus=16, seq_len=4096, global_batch=64)
    for i in (0, 3):
        c = p.candidates[i]
        r = cost_layout(CFG, HW, c.layout, seq_len=4096)
        assert r["memory_total"] == pytest.approx(c.memory) and r["step"]["total"] == pytest.approx(c.cost.total)
        assert r["fits"] and r["margin_bytes"] == pytest.approx(0.9 * HW.capacity_bytes - c.memory)
        assert r["rank"] == 1 + sum(x.cost.total < c.cost.total for x in p.candidates) and r["of"] == len(p.candidates)
        assert r["rank"] <= i + 1
        same = plan(CFG, HW, gpus=16, seq_len=4096, global_batch=64, recomputes=(c.layout.recompute,))
        assert r["rank_recompute"] == 1 + sum(x.cost.total < c.cost.total for x in same.candidates)
        assert r["of_recompute"] == len(same.candidates) <= r["of"]


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
    assert "fits, margin" in out and "production activations" in out
    assert "layouts that fit, " in out and "that fit with recompute=none" in out
    assert main([*argv, "--layout", "dp=16 zero=0 b=4"]) == 0  # 8B's unsharded Adam state alone is 128 GB
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "unranked, as it does not fit (its step time would place it at " in out
    assert main([*argv, "--layout", "dp=2 tp=2 pp=2"]) == 2  # 8 GPUs, not 16
    assert "try --gpus 8" in capsys.readouterr().err


def test_llama3_8k_layouts_counted_as_they_ran():
    """§3.3.2 of Dubey et al. 2024: one-layer chunks with the embedding and the output alone on the
    end chunks (v = 8 on pp16, ``test_llama3_light_ends_chunks``), no recomputation, gradients in
    fp32. The most loaded rank is the second: Megatron's warm-up keeps 2(p − 2) + (v − 1)p + 1 = 141
    chunk-micro-batches of one layer alive when m ≥ 2p (DP64, m = 32), and all m·v = 128 when m = p
    (DP128, m = 16). The state is training_memory's with Megatron's 4-byte main_grad."""
    cfg = ModelConfig.preset("llama-3.1-405b")
    block = production_block_bytes(cfg, seq_len=8192, micro_batch=1, tp=8)
    for dp, held in ((64, 141), (128, 128)):
        lay = parse_layout(f"dp={dp} tp=8 pp=16 zero=2 schedule=interleaved v=8 ends=light", global_batch=2048)
        r = cost_layout(cfg, HW, lay, seq_len=8192, rank=False)
        even = dataclasses.replace(lay, ends="even")  # the model state does not depend on the stage ends
        mem, ours = r["memory_bytes"], memory_breakdown(cfg, even, 8192, activations="ours")
        assert mem["activations"] == pytest.approx(held * block)
        assert mem["grads"] == pytest.approx(2 * ours["grads"]) and mem["params"] == ours["params"]
        # 90 % of the 81,559 MiB nvidia-smi reports: DP128 fits (1.4 GB to spare), DP64 does not (rank 1
        # holds 141 layer-micro-batches; the chapter says by how much)
        assert r["fits"] == (dp == 128)
    assert r["memory_total"] < 0.9 * HW.capacity_bytes < mem["params"] + mem["optimizer"] + mem["grads"] + 141 * block
    assert HW.capacity_bytes == 81_559 * 2**20
    z3 = dataclasses.replace(even, zero=3)  # FSDP's sharded fp32 gradient is ZeRO's 16Ψ/Nd count
    assert memory_breakdown(cfg, z3, 8192)["grads"] == memory_breakdown(cfg, z3, 8192, activations="ours")["grads"]
    with pytest.raises(ValueError, match="ends=light is counted with production activations"):
        memory_breakdown(cfg, lay, 8192, activations="ours")
    with pytest.raises(ValueError, match="ends is even or light"):
        parse_layout("dp=64 tp=8 pp=16 ends=heavy", global_batch=2048)
