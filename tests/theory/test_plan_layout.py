"""``playbook plan --layout``: one given layout costed by the search's own functions."""

import dataclasses

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.layout import cost_layout, parse_layout
from playbook.theory.plan.memory import memory_breakdown
from playbook.theory.inventory.prod_activations import production_block_bytes
from playbook.theory.plan.planner import plan
from playbook.theory.plan.search import Layout

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
    (DP128, m = 16).

    Its state, by hand: rank 1 holds eight one-layer chunks and neither the embedding nor the head
    (rank 0 holds seven layers and the embedding, 7·P + V·h/8 = 3.05e9 < 8·P). One layer on a tp8 rank:
    P = (3,187,703,808 − 2·16,384)/8 + 2·16,384 = 398,491,648 parameters (matrices split, the two
    RMSNorm weights whole), 8·P = 3,187,933,184 on rank 1: under ZeRO-2 with Megatron's 4-byte
    main_grad, params 2·8P, grads 4·8P/dp, Adam 12·8P/dp (7.17 GB at DP64). The even split's first
    stage, what was counted before, adds the embedding: V·h/8 = 262,668,288 more parameters."""
    cfg = ModelConfig.preset("llama-3.1-405b")
    block = production_block_bytes(cfg, seq_len=8192, micro_batch=1, tp=8)
    P = (3_187_703_808 - 2 * 16_384) // 8 + 2 * 16_384
    assert cfg.layer_params() == 3_187_703_808 and P == 398_491_648
    for dp, held in ((64, 141), (128, 128)):
        lay = parse_layout(f"dp={dp} tp=8 pp=16 zero=2 schedule=interleaved v=8 ends=light", global_batch=2048)
        r = cost_layout(cfg, HW, lay, seq_len=8192, rank=False)
        mem = r["memory_bytes"]
        assert mem["activations"] == pytest.approx(held * block)
        assert mem["params"] == 2 * 8 * P and mem["grads"] == pytest.approx(4 * 8 * P / dp)
        assert mem["optimizer"] == pytest.approx(12 * 8 * P / dp)
        # 90 % of the 81,559 MiB nvidia-smi reports: DP128 fits (1.9 GB to spare), DP64 does not (rank 1
        # holds 141 layer-micro-batches; the chapter says by how much)
        assert r["fits"] == (dp == 128)
        assert r["margin_bytes"] == pytest.approx(0.9 * HW.capacity_bytes - sum(mem.values()))
    assert HW.capacity_bytes == 81_559 * 2**20
    z3 = dataclasses.replace(lay, zero=3, pp=1, dp=2048, ends="even")  # FSDP's sharded fp32 gradient: 16Ψ/Nd
    assert memory_breakdown(cfg, z3, 8192)["grads"] == memory_breakdown(cfg, z3, 8192, activations="ours")["grads"]
    with pytest.raises(ValueError, match="ends=light is counted with production activations"):
        memory_breakdown(cfg, lay, 8192, activations="ours")
    with pytest.raises(ValueError, match="ends is even or light"):
        parse_layout("dp=64 tp=8 pp=16 ends=heavy", global_batch=2048)


def test_the_peak_is_the_most_of_state_and_activations_over_ranks():
    """Each rank's state from its own chunks: on Llama 3's light ends rank 0 holds seven layers and
    the embedding, rank 15 seven and the head (and the final norm), the others eight; the reported
    peak is the rank whose state + activations is the most (rank 1 here), red if the state were
    read from another rank than the activations."""
    from playbook.theory.plan.memory import rank_chunks, rank_state
    from playbook.theory.plan.memory import production_rank_activations

    cfg = ModelConfig.preset("llama-3.1-405b")
    lay = parse_layout("dp=128 tp=8 pp=16 zero=1 schedule=interleaved v=8 ends=light", global_batch=2048)
    P, table, h = 398_491_648, cfg.vocab_size * cfg.hidden // 8, cfg.hidden
    degrees = tuple(lay.degrees.items())
    params = [
        rank_state(cfg, degrees, 1, "main_grad", rank_chunks(cfg, 16, r, "interleaved", 8, "light"))[0]
        for r in range(16)
    ]
    assert params[0] == 2 * (7 * P + table) and params[15] == 2 * (7 * P + table + h)
    assert set(params[1:15]) == {2 * 8 * P}
    acts = production_rank_activations(
        cfg, seq_len=8192, micro_batch=1, microbatches=16, tp=8, pp=16, schedule="interleaved", v=8, ends="light"
    )
    states = {
        r: sum(rank_state(cfg, degrees, 1, "main_grad", rank_chunks(cfg, 16, r, "interleaved", 8, "light")))
        for r in acts
    }
    peak = max(acts, key=lambda r: states[r] + acts[r])
    mem = memory_breakdown(cfg, lay, 8192)
    assert peak == 1 and sum(mem.values()) == states[1] + acts[1] and mem["activations"] == acts[1]


@pytest.mark.parametrize(
    "name, flags",
    [
        ("llama-3.1-405b", dict(dp=128, tp=8, pp=16, zero=1)),  # Llama 3's 8K layout (issue 41: 165 GB vs 89 GB)
        ("llama-3.1-8b", dict(dp=4, tp=2, cp=2, zero=3, recompute="selective")),
        ("mixtral-8x7b", dict(dp=8, ep=8, pp=2, zero=2)),
    ],
)
def test_playbook_memory_is_plan_layouts_count_with_our_kernels(name, flags, capsys):
    """``playbook memory`` and ``plan --layout`` on one layout give one answer per category when they
    count the same kernels: memory counts our GPT's (bf16 gradients), the planner's default is the
    production stack's (fused kernels, fp32 main_grad), which is where their totals part."""
    import json

    from playbook.cli.main import main

    cfg = ModelConfig.preset(name)
    argv = ["memory", "--model", name, "--seq-len", "4096", "--attention", "flash", "--json"]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()] + (
        ["--sequence-parallel"] * (flags.get("tp", 1) > 1)
    )
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)["training"]
    degrees = dict(dp=1, tp=1, pp=1, cp=1, ep=1) | {
        k: v for k, v in flags.items() if k in ("dp", "tp", "pp", "cp", "ep")
    }
    lay = Layout(
        **degrees, zero=flags["zero"], micro_batch=1, microbatches=16, recompute=flags.get("recompute", "none")
    )
    want = memory_breakdown(cfg, lay, 4096, activations="ours")
    assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-12)
