"""The planner against published runs (``theory.plan_validation``, chapter 8b): Megatron-LM's Table 1
(Narayanan et al. 2021) and Llama 3's Table 4 (Dubey et al. 2024). Each row: predicted MFU against
published, whether the published layout fits, and where it ranks. The misses are named, not hidden."""

from __future__ import annotations

import pytest

from playbook.theory.plan_validation import (
    A100_PEAK_2021,
    MEGATRON_S,
    MEGATRON_TABLE_1,
    MEGATRON_V,
    done_when,
    llama3_runs,
    megatron_model_share,
    megatron_runs,
    validate,
)

# Table 1's other columns, to check the transcription: % of peak and aggregate petaFLOP/s
PERCENT = (44, 44, 46, 43, 44, 45, 47, 50, 52, 52)
AGGREGATE = (4.4, 8.8, 18.2, 34.6, 70.8, 143.8, 227.1, 297.4, 410.2, 502.0)


def test_table_1_as_transcribed_is_consistent_with_itself_and_eq_2():
    """Per-GPU × GPUs = aggregate, per-GPU / 312 = % of peak, eq. 2's parameter count = the first
    column; our SwiGLU stand-in of width 8·round(h/3) holds eq. 2's weights to 0.5 %."""
    for (billions, _, h, layers, _, _, gpus, _, tflops), pct, agg, run in zip(
        MEGATRON_TABLE_1, PERCENT, AGGREGATE, megatron_runs()
    ):
        assert abs(agg * 1e3 / gpus - tflops) <= 0.5 + 50 / gpus  # both columns rounded: 1 TFLOP/s, 0.1 PFLOP/s
        assert round(100 * tflops * 1e12 / A100_PEAK_2021) == pct
        eq2 = 12 * layers * h * h * (1 + 13 / (12 * h) + (MEGATRON_V + MEGATRON_S) / (12 * layers * h))
        # eq. 2 gives 1.65, 3.56 and 7.47 for the three smallest (printed 1.7, 3.6, 7.5); the rest to 0.3 %
        assert eq2 / 1e9 == pytest.approx(billions, rel=0.03 if billions < 8 else 3e-3)
        assert run.cfg.num_params() == pytest.approx(eq2, rel=5e-3)


def test_eq_3_without_the_recomputed_forward_is_palms_count():
    """Model FLOPs per token of the 145.6B GPT: eq. 3's terms less the recomputed forward, against
    ``theory.flops`` (PaLM's 6N + 12·l·h·s) on the stand-in: equal to 0.1 % (biases and norms)."""
    from playbook.theory.flops import flops_per_token

    run = megatron_runs()[6]
    h, layers, s = run.cfg.hidden, run.cfg.n_layers, MEGATRON_S
    eq3 = 96 * s * layers * h * h * (1 + s / (6 * h) + MEGATRON_V / (16 * layers * h)) / s  # per token
    assert eq3 * megatron_model_share(h, layers) == pytest.approx(flops_per_token(run.cfg, s), rel=1e-3)


def test_megatron_runs_interleave_as_section_5_1_says_with_whole_layers_per_chunk():
    """§5.1: "the interleaved pipeline schedule"; Table 1 prints no v, so each pipelined run gets the v,
    among those that give every chunk the same whole number of layers, the planner predicts fastest."""
    from playbook.hardware import Hardware
    from playbook.theory.plan_layout import cost_layout, parse_layout

    a100 = Hardware.preset("a100-80gb")
    for run in megatron_runs():
        lay = parse_layout(run.layout, global_batch=run.global_batch)
        if lay.pp == 1:
            assert lay.schedule == "1f1b" and lay.v == 1
            continue
        per_stage = run.cfg.n_layers // lay.pp
        assert lay.schedule == "interleaved" and per_stage % lay.v == 0 and lay.microbatches % lay.pp == 0
        plain = run.layout.split(" schedule=")[0]
        step = {
            v: cost_layout(
                run.cfg,
                a100,
                parse_layout(f"{plain} schedule=interleaved v={v}", global_batch=run.global_batch),
                seq_len=run.seq_len,
                rank=False,
            )["step"]["total"]
            for v in range(2, per_stage + 1)
            if per_stage % v == 0
        }
        assert step[lay.v] == min(step.values())


def test_both_readings_of_an_mfu_that_does_not_say_how_it_counts_attention():
    """PaLM's count over a causal one (attention halved): a few percent at 8K, 1.4× at 128K for 405B."""
    from playbook.theory.plan_validation import causal_factor

    cfg = llama3_runs()[0].cfg
    assert 1.03 < causal_factor(cfg, 8192) < 1.05 and 1.39 < causal_factor(cfg, 131072) < 1.41
    assert all(r.causal_reading for r in llama3_runs()) and not any(r.causal_reading for r in megatron_runs())


@pytest.fixture(scope="module")
def rows():
    return {r.run: validate(r) for r in megatron_runs() + llama3_runs()}


def test_every_published_run_against_issue_27s_three_bars(rows):
    """Issue 27's bars per row (``done_when``): fits, predicted MFU within ±15 % of published, and the
    published layout with its published recomputation in the top quarter of the layouts that fit.
    What holds and what does not, named: the five largest Megatron-LM runs (pipelined) and Llama 3's
    DP128 pass all three; Megatron-LM's 76.1B predicts 1.19× (interleaved, as §5.1 says); its four runs
    without a pipeline and the 39.1B rank below the top quarter, where the planner runs micro-batches
    larger than the 1 assumed; Llama 3's DP64 does not fit 90 % of the H100 (rank 1 keeps 141 one-layer
    micro-batches); its 128K row predicts 1.25× the MFU as printed, 0.90× had Llama 3 counted causal
    attention."""
    bars = {k: done_when(r) for k, r in rows.items()}
    passing = {k for k, b in bars.items() if all(b.values())}
    assert passing == {
        "145.6B, 1,536 A100s",
        "310.1B, 1,920 A100s",
        "529.6B, 2,520 A100s",
        "1008B, 3,072 A100s",
        "405B, 16,384 H100s, seq 8,192",
    }, bars
    assert {k for k, b in bars.items() if not b["within 15 %"]} == {
        "76.1B, 1,024 A100s",
        "405B, 16,384 H100s, seq 131,072",
    }
    assert 1.18 < rows["76.1B, 1,024 A100s"]["ratio"] < 1.2 and done_when(rows["76.1B, 1,024 A100s"])["top quarter"]
    long = rows["405B, 16,384 H100s, seq 131,072"]
    assert 1.2 < long["ratio"] < 1.3 and 0.85 < long["ratio_causal"] < 0.95 and long["top_quarter"]
    assert {k for k, b in bars.items() if not b["fits"]} == {"405B, 8,192 H100s, seq 8,192"}
    assert -7e9 < rows["405B, 8,192 H100s, seq 8,192"]["margin"] < -5e9
    low = {k for k, b in bars.items() if not b["top quarter"]}
    assert low == {
        "1.7B, 32 A100s",
        "3.6B, 64 A100s",
        "7.5B, 128 A100s",
        "18.4B, 256 A100s",
        "39.1B, 512 A100s",
        "405B, 8,192 H100s, seq 8,192",
    }


def test_megatron_ranks_low_among_every_recomputation_setting_because_it_recomputes(rows):
    """Among every setting Megatron-LM offered, none of its layouts (all recomputing) ranks in the top
    quarter: the planner finds the memory to skip recomputation; among full recomputation, the five
    pipelined runs from 76.1B up do. Llama 3 runs without recomputation, the planner's fastest too:
    its two ranks agree."""
    megatron = {k: r for k, r in rows.items() if not k.startswith("405B")}
    assert all(r["rank_stack"] > r["of_stack"] / 4 and r["rank"] < r["rank_stack"] for r in megatron.values())
    for r in (r for k, r in rows.items() if k.startswith("405B")):
        assert r["rank"] == r["rank_stack"]
