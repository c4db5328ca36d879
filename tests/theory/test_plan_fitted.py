"""The calibration's three fitted choices (``theory.plan.fitted``, chapter 8b): each alternative's ratio
derived here another way, and each one shown to miss where the calibrated choice passes (the reason it
is called fitted)."""

from __future__ import annotations

import pytest

from playbook.hardware import Hardware
from playbook.theory.plan.fitted import FITTED, alternatives
from playbook.theory.plan.layout import cost_layout, parse_layout
from playbook.theory.plan.validation import (
    A100_PEAK_2021,
    MEGATRON_S,
    MEGATRON_V,
    MICRO_BATCHES,
    PublishedRun,
    llama3_runs,
    megatron_runs,
    validate,
)


@pytest.fixture(scope="module")
def table():
    """(run, its row costed as calibrated, without ranks, its alternatives) for all thirteen rows."""
    out = []
    for run in megatron_runs() + llama3_runs():
        row = validate(run, rank=False)
        out.append((run, row, alternatives(run, row)))
    return out


def test_every_run_names_its_fitted_choices_and_nothing_else():
    assert all(r.fitted == ("overlap", "b and v") for r in megatron_runs())
    assert all(r.fitted == ("attention count",) for r in llama3_runs())
    bad = PublishedRun(**{**llama3_runs()[0].__dict__, "fitted": ("seq_len",)})
    with pytest.raises(ValueError, match="fitted choices are overlap, b and v, attention count"):
        alternatives(bad, validate(bad, rank=False))
    assert set(FITTED) == {"overlap", "b and v", "attention count"}


def test_palms_count_by_hand_over_the_causal_one(table):
    """PaLM's 6N + 12·L·H·Q·T over 6N + 6·L·H·Q·T, with N counted here from Llama 3.1 405B's widths
    (the matmuls' weights; the embedding is a lookup, the norms are 0.001 % of N): the ratio of the
    two columns, whatever the planner predicted."""
    h, layers, heads, kv, ffn, vocab = 16384, 126, 128, 8, 53248, 128256
    q = h // heads
    n = layers * (2 * h * h + 2 * h * kv * q + 3 * h * ffn) + h * vocab
    for run, _, alt in table:
        if "attention count" not in run.fitted:
            assert alt["palm"] is None
            continue
        attention = 12 * layers * heads * q * run.seq_len
        by_hand = (6 * n + attention) / (6 * n + attention / 2)
        assert alt["palm"] / alt["calibrated"] == pytest.approx(by_hand, rel=1e-4)


def test_dp_overlap_hides_all_but_the_last_bucket_of_the_all_reduce(table):
    """The four runs without a pipeline (ZeRO 0): with dp overlapped, the fp32 gradient's ring
    all-reduce over the dp ranks (2(n − 1)/n of its bytes at the network card's 25 GB/s, 10 µs a ring
    step: numbers derived here) hides behind the last micro-batch's backward but for its last 25 MiB
    bucket, so the step is that much shorter and the ratio that much higher."""
    a100 = Hardware.preset("a100-80gb")
    for run, row, alt in table[:4]:
        lay = parse_layout(run.layout, global_batch=run.global_batch)
        assert lay.pp == 1 and lay.zero == 0 and lay.dp * lay.tp > a100.devices_per_node

        def ring(size, n=lay.dp):
            return 2 * (n - 1) / n * size / 25e9 + 2 * (n - 1) * 10e-6

        params = run.cfg.num_params() / lay.tp  # a tp shard's parameters (vocabulary and widths divide by tp)
        step = cost_layout(run.cfg, a100, lay, seq_len=run.seq_len, rank=False, overlap="none")["step"]
        assert (2 / 3) * step["compute"] / lay.microbatches > ring(4 * params)  # the window holds it
        hidden = ring(4 * params) - ring(25 * 2**20)
        assert alt["dp_overlap"] == pytest.approx(
            alt["calibrated"] * step["total"] / (step["total"] - hidden), rel=1e-4
        )
    assert all(alt["dp_overlap"] is None for run, _, alt in table if "overlap" not in run.fitted)


def test_b_and_v_ratios_by_megatrons_own_flop_count(table):
    """Every b, v that fits (enumerated here as Table 1 allows them), its MFU from Narayanan et al.'s
    eq. 3 terms less the recomputed forward (72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)), not the planner's
    FLOP count): the range ``alternatives`` gives, the calibrated b, v at its top."""
    a100 = Hardware.preset("a100-80gb")
    for run, _, alt in table[:10]:
        lay = parse_layout(run.layout, global_batch=run.global_batch)
        h, layers, s = run.cfg.hidden, run.cfg.n_layers, MEGATRON_S
        flops = 72 * run.global_batch * s * layers * h * h * (1 + s / (6 * h) + MEGATRON_V / (12 * layers * h))
        per_stage = layers // lay.pp
        ratios = []
        for b in MICRO_BATCHES:
            for v in [v for v in range(2, per_stage + 1) if per_stage % v == 0] if lay.pp > 1 else [1]:
                m = run.global_batch // lay.dp // b
                if (run.global_batch // lay.dp) % b or m % lay.pp:
                    continue
                text = f"dp={lay.dp} tp={lay.tp} pp={lay.pp} zero=0 recompute=full b={b}"
                text += f" schedule=interleaved v={v}" if lay.pp > 1 else ""
                lay_bv = parse_layout(text, global_batch=run.global_batch)
                r = cost_layout(run.cfg, a100, lay_bv, seq_len=s, rank=False, overlap="none", mem_util=1.0)
                if r["fits"]:
                    mfu = flops / (r["step"]["total"] * r["gpus"] * A100_PEAK_2021)
                    ratios.append(mfu / run.published_mfu)
        low, high, count = alt["b_v"]
        assert count == len(ratios) and high == alt["calibrated"]
        assert (low, high) == pytest.approx((min(ratios), max(ratios)), rel=2e-3)  # eq. 3 vs PaLM's: biases, norms
    assert all(alt["b_v"] is None for run, _, alt in table[10:])


def test_each_fitted_choice_is_where_its_alternative_misses(table):
    """Calibrated, all thirteen within ±15 %; each alternative puts some row outside: what makes the
    choice fitted rather than free."""
    outside = lambda x: abs(x - 1) > 0.15  # noqa: E731
    assert not any(outside(alt["calibrated"]) for _, _, alt in table)
    assert any(outside(alt["dp_overlap"]) for _, _, alt in table[:10])
    assert any(outside(alt["b_v"][0]) for _, _, alt in table[:10])
    assert any(outside(alt["palm"]) for _, _, alt in table[10:])
