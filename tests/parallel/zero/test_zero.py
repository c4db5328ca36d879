"""Chapter 2: ZeRO-1/2/3 from scratch and FSDP2 on real ranks, against the single-process reference,
with memory and communication equal to the predictions of playbook.theory.zero.zero."""

import json

import pytest

from playbook.cli import main
from playbook.cluster import Ranks
from playbook.config import ModelConfig
from playbook.parallel.zero import fsdp2
from playbook.parallel.zero import run as zero_run
from playbook.parallel.parity import assert_parity
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup, train
from playbook.viz.widgets import STALE
from playbook.cluster.trace.spans import op_family as op_name
from playbook.parallel.zero.sharded import MOMENTS
from playbook.theory.zero.sharded import fsdp2_comm_per_step, predicted_memory
from playbook.theory.hybrid.memory import training_memory
from playbook.theory.zero.zero import (
    check_stage,
    fsdp2_state_bytes,
    padded,
    padding_elements,
    zero3_gathered_peak,
    zero_collectives_per_step,
    zero_comm_per_step,
    zero_memory_by_moment,
    zero_state_bytes,
    zero_units,
)

TINY = ModelConfig.preset("gpt-tiny")  # vocab 64, hidden 64, 2 layers, 4 heads, 2 KV heads, ffn 176
SETUP = TrainSetup(model="gpt-tiny", steps=3, global_batch=8, seq_len=32)
# Hand count for gpt-tiny (head_dim 16): embedding 64·64; a block: two norms 2·64, q and o 64·64 each,
# k and v 64·(2·16) each, SwiGLU 3·64·176; the head: final norm 64 + lm_head 64·64.
EMBED, BLOCK, HEAD = 64 * 64, 2 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176, 64 + 64 * 64

# Tolerances (fp32): ``parallel.parity``'s max(1e-5, 3 x the float floor), figure by figure. Loss and
# first-step gradients differ only in summation order, ~1e-7; a wrong averaging factor is off by
# (N-1)·100%. Parameters after several AdamW steps, relative L2 per tensor: Adam divides by sqrt(v),
# so on weights whose gradient is ~1e-9 (pure rounding noise) the update is ±lr whichever way the
# noise fell, a worst-element difference of ~1e-4 (information only); over a whole tensor those few
# elements stay near the float floor, while a missed or doubled update is ~10%.


@pytest.fixture(scope="module")
def reference():
    return train(SETUP)


# ---- theory, derived by hand ---------------------------------------------------------------------
def test_units_cover_the_model_exactly():
    assert zero_units(TINY) == [("embed", EMBED), ("block0", BLOCK), ("block1", BLOCK), ("head", HEAD)]
    assert EMBED + 2 * BLOCK + HEAD == TINY.num_params() == 100_672


def test_tied_embeddings_are_refused():
    with pytest.raises(ValueError, match="tie_embeddings"):
        zero_units(TINY.replace(tie_embeddings=True))


@pytest.mark.parametrize("stage", [4, -1, "2", True, 1.0])
def test_bad_stage_is_a_clear_error(stage):
    with pytest.raises(ValueError, match="0, 1, 2 or 3"):
        check_stage(stage)


def test_exact_bytes_at_two_ranks_no_padding():
    # every unit divides by 2: Σ padded = Ψ = 100,672; slice 50,336; 4 units -> 4 step counters
    psi, s = 100_672, 50_336
    assert zero_state_bytes(TINY, stage=0, world_size=2).as_dict() == {
        "params": 4 * psi,
        "grads": 4 * psi,
        "optimizer": 8 * psi + 16,
        "total": 16 * psi + 16,
    }
    assert zero_state_bytes(TINY, stage=1, world_size=2).optimizer == 8 * s + 16
    assert zero_state_bytes(TINY, stage=2, world_size=2).grads == 4 * s
    assert zero_state_bytes(TINY, stage=3, world_size=2).as_dict() == {
        "params": 4 * s,
        "grads": 4 * s,
        "optimizer": 8 * s + 16,
        "total": 16 * s + 16,
    }


def test_exact_bytes_at_three_ranks_include_padding():
    # 4096 = 3·1365 + 1 -> pad 2; 46208 = 3·15402 + 2 -> pad 1; 4160 = 3·1386 + 2 -> pad 1
    assert padding_elements(TINY, 3) == {"embed": 2, "block0": 1, "block1": 1, "head": 1}
    total = 4098 + 2 * 46209 + 4161  # 100,677 elements in the padded buffers
    assert padded(EMBED, 3) == 4098 and total == 100_677
    m = zero_state_bytes(TINY, stage=3, world_size=3)
    assert (m.params, m.grads, m.optimizer) == (4 * 33_559, 4 * 33_559, 8 * 33_559 + 16)
    assert zero_state_bytes(TINY, stage=1, world_size=3).params == 4 * total


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_exact_form_is_the_papers_formula_when_nothing_is_padded(stage, n):
    exact = zero_state_bytes(TINY, stage=stage, world_size=n)
    paper = training_memory(TINY, seq_len=32, micro_batch=1, dp=n, zero=stage, precision="fp32", n_tensors=4)
    assert (exact.params, exact.grads, exact.optimizer) == (paper.params, paper.grads, paper.optimizer)


def test_memory_by_moment_drops_gradients_only_for_stages_2_and_3():
    for stage, grads_after_forward in ((0, 4 * 100_672), (1, 4 * 100_672), (2, 0), (3, 0)):
        m = zero_memory_by_moment(TINY, stage=stage, world_size=2)
        assert m["after forward"]["grads"] == grads_after_forward
        assert m["after backward"] == m["after step"]


def test_comm_volume_by_hand():
    S, n = 4 * 100_672, 4  # bytes of all gradients; ring: each rank sends 3/4 of a gather or scatter
    assert zero_comm_per_step(TINY, stage=0, world_size=n, loss_bytes=0) == {"all_reduce": 2 * S * 3 / 4}
    assert zero_comm_per_step(TINY, stage=1, world_size=n, loss_bytes=0) == {
        "reduce_scatter": S * 3 / 4,
        "all_gather": S * 3 / 4,
    }
    assert zero_comm_per_step(TINY, stage=2, world_size=n, loss_bytes=0) == zero_comm_per_step(
        TINY, stage=1, world_size=n, loss_bytes=0
    )
    three = zero_comm_per_step(TINY, stage=3, world_size=n, loss_bytes=0)
    assert three == {"reduce_scatter": S * 3 / 4, "all_gather": 2 * S * 3 / 4}  # 1.5× DP
    assert zero_comm_per_step(TINY, stage=3, world_size=n)["all_reduce"] == 2 * 4 * 3 / 4  # the loss
    assert zero_collectives_per_step(TINY, stage=3) == {"reduce_scatter": 4, "all_gather": 8, "all_reduce": 1}


def test_gathered_peak_by_hand():
    # padded at 2 ranks: 4096, 46208, 46208, 4160. Forward: unit k (+ k+1 in flight with prefetch);
    # backward: unit k's weights + its flat gradient (+ unit k-1's weights with prefetch).
    assert zero3_gathered_peak(TINY, world_size=2, prefetch=False) == {"forward": 4 * 46208, "backward": 8 * 46208}
    assert zero3_gathered_peak(TINY, world_size=2, prefetch=True) == {
        "forward": 4 * (46208 + 46208),
        "backward": 4 * (2 * 46208 + 46208),
    }


def test_fsdp2_prediction_refuses_uneven_splits():
    assert fsdp2_state_bytes(TINY, world_size=4).optimizer == 8 * 100_672 // 4 + 4 * TINY.num_param_tensors()
    with pytest.raises(ValueError, match="does not divide"):
        fsdp2_state_bytes(TINY, world_size=3)


def test_op_names_are_normalised():
    assert [
        op_name(x) for x in ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
    ] == ["all_gather", "all_gather", "reduce_scatter", "all_reduce"]


# ---- real ranks --------------------------------------------------------------------------------
def _check_parity(result, reference, setup=SETUP):
    assert_parity(compare(result, reference), setup)


def _check_zero_run(results, stage, n, reference, setup=SETUP, prefetch=True):
    cfg = setup.config()
    want = zero_memory_by_moment(cfg, stage=stage, world_size=n)
    predicted = predicted_memory(setup, stage=stage, world_size=n, prefetch=prefetch)
    for r in results:  # every rank holds the same bytes
        _check_parity(r, reference, setup)
        for moment in MOMENTS:
            got = {k: r.moments[moment][k] for k in ("params", "grads", "optimizer")}
            assert got == want[moment], (moment, got, want[moment])
            assert r.moments[moment]["gathered"] == 0  # nothing whole is left between units
        assert r.memory["activations"] == predicted["activations"]
        assert r.comm == pytest.approx(zero_comm_per_step(cfg, stage=stage, world_size=n), rel=1e-12)
        assert r.counts == zero_collectives_per_step(cfg, stage=stage)
        if stage == 3:
            assert r.memory["peak_gathered"] == predicted["peak_gathered"]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_on_two_ranks(ranks2, reference, stage):
    _check_zero_run(ranks2.run(zero_run.on_rank, SETUP, stage=stage, progress=False), stage, 2, reference)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_on_four_ranks(ranks4, reference, stage):
    _check_zero_run(ranks4.run(zero_run.on_rank, SETUP, stage=stage, progress=False), stage, 4, reference)


def test_zero3_without_prefetch(ranks4, reference):
    results = ranks4.run(zero_run.on_rank, SETUP, stage=3, prefetch=False, progress=False)
    _check_zero_run(results, 3, 4, reference, prefetch=False)


def _overlaps(spans):
    """(comm, compute) pairs where a collective was issued before a compute span and waited on
    after it (``waited``; its ``end`` is when it completed, which depends on timing)."""
    comm = [s for s in spans if s["kind"] == "comm"]
    compute = [s for s in spans if s["kind"] == "compute" and s["name"] in ("forward", "backward")]
    return [(c, k) for c in comm for k in compute if c["start"] <= k["start"] and k["end"] <= (c["waited"] or c["end"])]


def test_prefetch_issues_the_next_gather_before_the_compute(ranks2):
    # ordering, not speed: with prefetch each unit's gather (but the first in each pass) is issued
    # before the previous unit computes and waited on after it; without, none is in flight then.
    with_prefetch = ranks2.run(zero_run.on_rank, SETUP, stage=3, prefetch=True, progress=False)[0].spans
    without = ranks2.run(zero_run.on_rank, SETUP, stage=3, prefetch=False, progress=False)[0].spans
    assert len(_overlaps(with_prefetch)) >= 2 * (len(zero_units(TINY)) - 1)
    assert _overlaps(without) == []


def test_padding_on_three_ranks(rank_sets):
    setup = TrainSetup(model="gpt-tiny", steps=3, global_batch=6, seq_len=32)
    three = rank_sets.setdefault(3, Ranks(3, backend="gloo", timeout=60)).start()
    for stage in (2, 3):
        _check_zero_run(
            three.run(zero_run.on_rank, setup, stage=stage, progress=False), stage, 3, train(setup), setup=setup
        )


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp2_matches_reference_and_prediction(rank_sets, reference, n):
    ranks = rank_sets.setdefault(n, Ranks(n, backend="gloo", timeout=60)).start()
    results = ranks.run(fsdp2.on_rank, SETUP, progress=False)
    want = fsdp2_state_bytes(TINY, world_size=n)
    for r in results:
        _check_parity(r, reference)
        assert r.moments["after forward"] == {"params": want.params, "grads": 0, "optimizer": want.optimizer}
        assert r.moments["after backward"] == {"params": want.params, "grads": want.grads, "optimizer": want.optimizer}
        assert r.memory["activations"] == SETUP.predicted_memory(n).activations
        assert r.comm == pytest.approx(fsdp2_comm_per_step(SETUP, world_size=n), rel=1e-12)
        # calls per step, counted as for our ZeRO-3 (whose units split the root in two: 4, not 3):
        # L + 1 groups (2 blocks, the root), each gathered before its forward and its backward and
        # reduce-scattered once, plus the loss. One group for the whole model (blocks not wrapped)
        # would send the same bytes in 2 gathers and 1 reduce-scatter.
        L = TINY.n_layers
        assert r.counts == {"all_gather": 2 * (L + 1), "reduce_scatter": L + 1, "all_reduce": 1}
        # each gather is one group's fp32 weights: a block 46,208 parameters, the root 2·64·64 + 64
        block, root = 4 * (2 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176), 4 * (2 * 64 * 64 + 64)
        gathers = sorted(x["bytes"] for x in r.spans if x["name"] in ("all_gather_single", "all_gather_into_tensor"))
        assert gathers == [root] * 2 + [block] * 2 * L


# ---- the command line ----------------------------------------------------------------------------
def test_cli_zero_json(capsys):
    assert main(["run", "zero", "--stage", "2", "--world-size", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["strategy"] == "zero-2" and report["parity"]["within_bounds"] is True
    for k in ("params", "grads", "optimizer", "activations"):
        assert report["memory"]["measured"][k] == report["memory"]["predicted"][k]
    assert report["comm"]["measured"] == pytest.approx(report["comm"]["predicted"], rel=1e-12)


def test_cli_refuses_a_bad_stage(capsys):
    assert main(["run", "zero", "--stage", "4", "--world-size", "2"]) == 2
    assert "--stage must be between 0 and 3, got 4" in capsys.readouterr().err


# ---- figures -------------------------------------------------------------------------------------
def test_figures_carry_the_numbers():
    from playbook.viz.zero import comm_volume_bars, fitting_devices, gathered_over_time
    from playbook.viz.zero_dashboard import zero_dashboard

    fig = comm_volume_bars(
        {"DP": {"all_reduce": 10.0}, "ZeRO-3": {"all_gather": 10.0, "reduce_scatter": 5.0}}, unit="bytes"
    )
    assert [t.name for t in fig.data] == ["all_reduce", "reduce_scatter", "all_gather"]
    assert list(fig.data[2].customdata) == [0.0, 10.0]
    fig = gathered_over_time({"run": [(1.0, "forward", 0), (1.002, "forward", 8)]}, unit="bytes")
    assert list(fig.data[0].y) == [0, 8] and fig.data[0].x[1] == pytest.approx(2.0)
    assert [ok for _, _, ok in fitting_devices(100e9)] == sorted(ok for _, _, ok in fitting_devices(100e9))
    box = zero_dashboard(model="llama-3.1-8b", dp=8, stage=0)
    before = sum(t.y[0] for t in box.memory_figure.data)
    box.controls["stage"].value = 3
    assert sum(t.y[0] for t in box.memory_figure.data) < before


def test_zero_dashboard_offers_only_models_it_computes_and_marks_a_refusal_stale():
    from playbook.viz.zero_dashboard import zero_dashboard

    box = zero_dashboard(model="llama-3.1-8b", dp=8, stage=1)
    for name in box.controls["model"].options:  # every offered model draws, none is refused
        box.controls["model"].value = name
        assert "Cannot compute" not in box.message.value, name
        assert name in box.memory_figure.layout.title.text
    assert not {"gpt-tiny-moe", "mixtral-8x7b", "deepseek-v3"} & set(box.controls["model"].options)
    box.controls["model"].options = [*box.controls["model"].options, "no-such-model"]
    box.controls["model"].value = "no-such-model"  # a refusal: the figures keep the last settings, and say so
    assert "Cannot compute" in box.message.value
    assert all(STALE in f.layout.title.text for f in (box.memory_figure, box.comm_figure))


def test_zero_dashboard_slider_shows_the_length_its_figures_use():
    """gpt-small takes at most 128 tokens: its slider offers no more, the title says the slider's
    length, and a model that takes the length asked for before gets it back."""
    from playbook.viz.zero_dashboard import zero_dashboard

    box = zero_dashboard(model="llama-3.1-8b", seq_len=16384)
    box.controls["model"].value = "gpt-small"
    cfg = ModelConfig.preset("gpt-small")
    assert max(box.controls["seq_len"].options) <= cfg.max_seq_len == box.controls["seq_len"].value
    assert f"seq {cfg.max_seq_len:,}," in box.memory_figure.layout.title.text
    box.controls["model"].value = "llama-3.1-8b"
    assert box.controls["seq_len"].value == 16384 and "seq 16,384," in box.memory_figure.layout.title.text


# ---- chapter 2's quoted numbers ------------------------------------------------------------------
def test_chapter2_largest_unit_sets_the_llama_8b_transient():
    # embedding and head: 128,256 × 4,096 each, 6.5% of 8.03e9; a block 2.7%
    cfg = ModelConfig.preset("llama-3.1-8b")
    psi, units = cfg.num_params(), dict(zero_units(cfg))
    assert round(units["embed"] / psi, 3) == round(units["head"] / psi, 3) == 0.065
    assert round(units["block0"] / psi, 3) == 0.027
    # backward with prefetch: head weights + head gradient + last block, bf16: 2·(2·head + block)
    peak = zero3_gathered_peak(cfg, world_size=8, prefetch=True, precision="mixed")["backward"]
    assert round(peak / 1e9, 2) == 2.54 and round(peak / (2 * psi), 2) == 0.16


def test_chapter2_question3_70b_ranks_with_full_recomputation():
    # model state + stored activations + what the backward holds in its worst phase (chapter 2, Q3).
    # The head's phase holds the most gathered bytes (5.9 GB) but recomputes nothing (its activations
    # are stored); a block's phase holds 5.1 GB gathered while that block is recomputed (3.8 GB), block
    # 0's 5.5 GB (the embedding, prefetched next, is larger than a block)
    from playbook.theory.inventory.activations import block_activation_bytes
    from playbook.theory.zero.zero import zero3_backward_by_unit

    cfg = ModelConfig.preset("llama-3.1-70b")
    working = block_activation_bytes(cfg, seq_len=4096, micro_batch=1, dtype_bytes=2)
    assert round(working / 1e9, 1) == 3.8

    def phases(n):
        held = training_memory(cfg, seq_len=4096, micro_batch=1, dp=n, zero=3, recompute="full").total
        units = zero3_backward_by_unit(cfg, world_size=n, prefetch=True, precision="mixed")
        block = max(b for name, b in units.items() if name.startswith("block"))
        return {"head": held + units["head"], "block": held + block + working}

    def peak(n):
        return max(phases(n).values())

    assert (
        round(training_memory(cfg, seq_len=4096, micro_batch=1, dp=16, zero=3, recompute="full").total / 1e9, 1) == 77.2
    )
    units = zero3_backward_by_unit(cfg, world_size=16, prefetch=True, precision="mixed")
    gathered = zero3_gathered_peak(cfg, world_size=16, prefetch=True, precision="mixed")["backward"]
    assert max(units.values()) == gathered and round(gathered / 1e9, 1) == 5.9
    assert round(units["block79"] / 1e9, 1) == 5.1  # 2·(2 blocks) + 2·(1 block) bytes, bf16
    assert round(units["block0"] / 1e9, 1) == 5.5  # 2·(block + embedding) + 2·block
    assert {k: round(v / 1e9, 1) for k, v in phases(16).items()} == {"head": 83.1, "block": 86.5}
    held16 = training_memory(cfg, seq_len=4096, micro_batch=1, dp=16, zero=3, recompute="full").total
    assert round((held16 + units["block79"] + working) / 1e9, 1) == 86.1  # any block but the first
    assert [round(peak(n) / 1e9, 1) for n in (16, 17, 18)] == [86.5, 82.3, 78.6]
    assert min(n for n in range(1, 64) if peak(n) <= 80e9) == 18  # the package's h100-sxm: 80e9 bytes
    assert min(n for n in range(1, 64) if peak(n) <= 80 * 2**30) == 17  # the real HBM: 80 GiB
