"""Shrinking a planner candidate to gpt-tiny on a few ranks: the rules by hand, every shrunk layout
accepted by the hybrid, bad input in one line, and one real 4-rank replay measured == predicted to
the byte."""

from __future__ import annotations

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.dims import ParallelDims
from playbook.theory.plan.search import Layout
from playbook.theory.plan.planner import plan
from playbook.theory.plan.shrink import first_shrinkable, shrink
from playbook.parallel.report import GATED


TINY_MOE = ModelConfig.preset("gpt-tiny-moe")


def lay(**kw) -> Layout:
    base = dict(dp=1, tp=1, pp=1, cp=1, ep=1, zero=1, micro_batch=1, microbatches=256, recompute="none")
    return Layout(**{**base, **kw})


def test_dp8_tp8_pp32_keeps_its_three_axes_at_two_each():
    s = shrink(lay(dp=8, tp=8, pp=32), model=ModelConfig.preset("llama-3.1-405b"))
    assert s.dims == ParallelDims(dp=2, tp=2, pp=2) and s.model == "gpt-tiny"
    # ZeRO-1 over dp and sequence parallelism compose with a pipeline: both kept, nothing said about them
    assert s.zero == 1 and s.sequence_parallel
    assert s.microbatches == 4 and s.global_batch == 2 * 4 * 2  # m = 2·pp; dp · m · 2 rows
    notes = " | ".join(s.notes)
    for said in ("dp 8 → 2", "tp 8 → 2", "pp 32 → 2", "→ 4"):
        assert said in notes
    assert "ZeRO" not in notes and "sequence parallelism" not in notes
    assert "llama-3.1-405b → gpt-tiny" in notes
    assert s.command().startswith(
        "playbook run hybrid --model gpt-tiny --dp 2 --tp 2 --pp 2 --zero 1 --sequence-parallel --microbatches 4"
    )


def test_zero_is_kept_where_the_hybrid_composes_it_and_sequence_parallelism_otherwise():
    with_zero = shrink(lay(dp=8, tp=8, zero=1))
    assert (with_zero.dims, with_zero.zero, with_zero.sequence_parallel) == (ParallelDims(dp=2, tp=2), 1, True)
    zero3 = shrink(lay(dp=8, tp=8, zero=3))  # ZeRO-3 and SP both kept: the norms are summed over tp first
    assert (zero3.zero, zero3.sequence_parallel) == (3, True) and not any("ZeRO" in n for n in zero3.notes)
    in_pp = shrink(lay(dp=8, tp=8, pp=8, zero=3))  # ZeRO-3 inside a pipeline: gathered once a step, kept
    assert (in_pp.zero, in_pp.sequence_parallel) == (3, True) and not any("ZeRO" in n for n in in_pp.notes)
    assert shrink(lay(dp=8, tp=8, pp=8, zero=2)).zero == 2  # ZeRO-2 reduces on the last micro-batch there
    no_replicas = shrink(lay(tp=8, pp=8, zero=1))  # dp·cp = 1: nothing to shard over
    assert no_replicas.zero == 0 and any("dp·cp = 1" in n for n in no_replicas.notes)
    assert with_zero.microbatches is None and with_zero.global_batch == 4
    assert any("gradient accumulation over 256" in n for n in with_zero.notes)
    no_zero = shrink(lay(dp=8, tp=8, zero=0, microbatches=1))
    assert no_zero.sequence_parallel and not any("sequence" in n for n in no_zero.notes)
    single = shrink(lay(tp=4, zero=0, microbatches=1))  # one axis: 2 ranks
    assert single.dims.world == 2 and single.zero == 0


def test_cp_inside_a_pipeline_keeps_all_four_axes_and_drop_still_leaves_one_out():
    big = lay(dp=8, tp=8, pp=32, cp=8)  # the Llama 3 405B shape: every axis kept at 2, on 16 ranks
    with pytest.raises(ValueError, match="4 axes > 1 need 2\\^4 = 16 ranks"):
        shrink(big)
    s = shrink(big, max_ranks=16)
    assert (s.dims, s.zero, s.sequence_parallel) == (ParallelDims(dp=2, tp=2, pp=2, cp=2), 1, True)
    three = shrink(lay(tp=8, pp=32, cp=8, zero=1))
    assert (three.dims, three.zero) == (ParallelDims(tp=2, pp=2, cp=2), 1)  # ZeRO-1 over cp
    dropped = shrink(big, drop=("cp",))
    assert dropped.dims == ParallelDims(dp=2, tp=2, pp=2) and dropped.notes[0] == "cp8 left out, as asked (drop)"


def test_expert_parallelism_borrows_ranks_and_moe_keeps_to_dp_and_ep():
    mixtral = ModelConfig.preset("mixtral-8x7b")
    s = shrink(lay(dp=64, ep=8, recompute="full"), model=mixtral)
    assert (s.model, s.dims, s.dims.world) == ("gpt-tiny-moe", ParallelDims(dp=2, ep=2), 2)
    assert s.zero == 1 and not any("ZeRO" in n for n in s.notes)  # ZeRO-1 with EP, as DeepSeek-V3 trains
    assert s.recompute == "full" and not any(n.startswith("recompute=") for n in s.notes)  # replayed as planned
    # MoE composes with tp and pp now: every axis kept (the hybrid's one table, ``theory.hybrid.composition``)
    assert shrink(lay(dp=8, tp=8, ep=8), model=mixtral).dims == ParallelDims(dp=2, tp=2, ep=2)
    in_pp = shrink(lay(dp=8, pp=8, schedule="interleaved", v=2), model=mixtral)  # MoE stages follow the chunks
    assert in_pp.dims == ParallelDims(dp=2, pp=2) and (in_pp.schedule, in_pp.virtual_stages) == ("interleaved", 2)
    on_v = shrink(lay(dp=8, pp=8, schedule="zb-v", v=2), model=mixtral)
    assert (on_v.schedule, on_v.virtual_stages) == ("zb-v", 2)


def test_recomputation_is_replayed_as_planned():
    """Every recomputation mode composes with every layout (``theory.hybrid.composition``), so the replay
    keeps the planned one, a split backward and an MoE model included, and its command says it."""
    kept = shrink(lay(dp=8, tp=8, pp=8, recompute="full"))
    assert kept.recompute == "full" and kept.command().split("--recompute ")[1].startswith("full ")
    assert shrink(lay(dp=8, tp=8, recompute="selective")).recompute == "selective"
    assert shrink(lay(dp=8, pp=8, schedule="zb-h1", recompute="full")).recompute == "full"
    assert "--recompute" not in shrink(lay(dp=8, tp=8)).command()


@pytest.mark.parametrize(
    "layout, kw, words",
    [
        (lay(dp=2, tp=8, cp=4), dict(max_ranks=4), "3 axes > 1 need 2^3 = 8 ranks"),
        (lay(dp=8, ep=8), dict(drop=("dp",)), "ep borrows ranks from dp·cp"),
        (lay(dp=8, tp=8), dict(drop=("xp",)), "names no axis"),
    ],
)
def test_layouts_that_cannot_be_shrunk_say_why_in_one_line(layout, kw, words):
    with pytest.raises(ValueError) as e:
        shrink(layout, **kw)
    assert words in str(e.value) and "\n" not in str(e.value) and str(layout) in str(e.value)


def test_every_shrunk_candidate_of_a_real_plan_passes_the_hybrids_checks():
    """The shrink rules restate what ``playbook run hybrid`` composes: ``Plan.check`` must agree."""
    from playbook.parallel.hybrid.replay import setup_and_plan

    cfg = ModelConfig.preset("llama-3.1-70b")
    planned = plan(cfg, Hardware.preset("h100-sxm"), gpus=64, seq_len=8192, global_batch=512)
    shrunk = 0
    for c in planned.candidates:
        for drop in ((), ("cp",), ("pp",)):
            try:
                s = shrink(c, model=cfg, drop=drop)
            except ValueError:
                continue
            setup_and_plan(s)  # raises if the hybrid refuses the layout
            assert s.dims.world <= 8
            shrunk += 1
    assert shrunk >= len(planned.candidates)
    i, s = first_shrinkable(planned, max_ranks=4)
    assert s.dims.world <= 4 and s.source == planned.candidates[i].layout
    for faster in planned.candidates[:i]:  # every faster candidate needs more ranks or an axis dropped
        with pytest.raises(ValueError):
            shrink(faster, model=cfg, max_ranks=4)


def test_a_shrunk_candidate_on_four_real_ranks_matches_its_prediction_to_the_byte(ranks4):
    from playbook.parallel.hybrid.replay import replay

    s = shrink(lay(dp=8, tp=8, zero=3, microbatches=64))  # dp2×tp2 ZeRO-3
    assert s.dims.world == 4
    before = s.predict()  # nothing has run yet
    result = replay(s, cluster=ranks4)
    assert {r["rank"] for r in result.rows} == {0, 1, 2, 3}
    assert {(r["what"], r["key"]) for r in result.rows} == {
        ("bytes sent", "dp"),
        ("bytes sent", "tp"),
        *[("memory", k) for k in ("params", "grads", "optimizer", "activations")],
    }
    for r in result.rows:
        assert r["predicted"] is not None and r["predicted"] == r["measured"] and r["before_run"], r
        source = before[r["rank"]]["bytes" if r["what"] == "bytes sent" else "memory"][r["key"]]
        assert r["predicted"] == source  # the rows carry the prediction made before the run
    assert result.exact
    # after 3 AdamW steps on 2 rows per replica, Adam's normalisation lifts 1e-7 rounding to a few
    # 1e-5: the replay is held to max(1e-5, 3x the float floor of its own shrunk setup)
    assert result.parity["within_bounds"] is True and set(result.parity["bounds"]) == set(GATED), result.parity
    with pytest.raises(ValueError, match=r"needs 2 ranks, the cluster has 4; pass ranks\(2\)"):
        replay(shrink(lay(dp=8, zero=0)), cluster=ranks4)


def test_a_shrunk_candidate_with_full_recomputation_replays_it_on_four_real_ranks(ranks4):
    """tp2×pp2 with SP and recompute=full: the recomputed forward sends its TP collectives again and
    the stages keep only each block's input; both predicted before the run, both measured."""
    from dataclasses import replace

    from playbook.parallel.hybrid.replay import replay

    s = shrink(lay(tp=8, pp=8, zero=0, recompute="full"))
    assert (s.dims, s.recompute, s.sequence_parallel) == (ParallelDims(tp=2, pp=2), "full", True)
    kept_all = replace(s, recompute="none").predict()
    for full, none in zip(s.predict(), kept_all):  # what recomputation changes, in the prediction itself
        assert full["bytes"]["tp"] > none["bytes"]["tp"]
        assert full["memory"]["activations"] < none["memory"]["activations"]
    result = replay(s, cluster=ranks4)
    assert result.exact and all(r["before_run"] for r in result.rows), [r for r in result.rows if not r["before_run"]]
    assert result.parity["within_bounds"] is True, result.parity


def test_playbook_plan_prints_a_runnable_replay_and_runs_it_with_replay(capsys):
    """The printed replay line is the shrunk candidate's (the hybrid accepts it), and ``--replay``
    runs it on fresh ranks: every number predicted == measured, exit 0."""
    import json

    from playbook.cli import main

    argv = ["plan", "--model", "llama-3.1-70b", "--gpus", "64", "--replay-ranks", "4"]
    argv += [
        "--activations",
        "ours",
        "--schedules",
        "1f1b",
        "--overlap",
        "dp",
    ]  # the ranking these pinned lines come from (chapter 8b's)
    assert main([*argv, "--json"]) == 0
    launch = json.loads(capsys.readouterr().out)["launch"]
    # #1 (dp4×tp4×pp2×cp2) needs 16 ranks at degree 2; #2, dp1×pp8×cp8 ZeRO-2: cp inside the pipeline,
    # ZeRO-2 over cp there
    assert launch["replay_candidate"] == 2
    assert launch["replay_notes"][:2] == [
        "pp 8 → 2: gpt-tiny has 2 layers: 2 stages of one layer",
        "cp 8 → 2: 2 ranks keep the ring's K/V passes",
    ]
    assert not any("ZeRO" in n for n in launch["replay_notes"])
    assert launch["replay"] == (
        "playbook run hybrid --model gpt-tiny --dp 1 --pp 2 --cp 2 --zero 2 --microbatches 4 "
        "--global-batch 8 --seq-len 32"
    )
    assert main([*argv, "--replay"]) == 0
    out = capsys.readouterr().out
    assert "replayed on 4 real ranks" in out and "every number predicted == measured: True" in out
    assert "rank 3 memory     activations" in out and "differs" not in out
    assert main([*argv, "--replay", "--replay-ranks", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--replay-ranks must be in 2..8" in err[0]


def test_a_shrunk_moe_candidate_replays_with_its_routing_dependent_numbers_marked(ranks2):
    """ep's all-to-all bytes and a MoE's activations follow from the routing: predicted from the
    run's routing (``before_run`` False), still equal to the measurement; dp's bytes and the weights
    are predicted before the run."""
    from playbook.parallel.hybrid.replay import replay

    s = shrink(lay(dp=64, ep=8, microbatches=4), model=ModelConfig.preset("mixtral-8x7b"))
    result = replay(s, cluster=ranks2)
    assert result.exact
    late = {(r["what"], r["key"]) for r in result.rows if not r["before_run"]}
    assert late == {("bytes sent", "ep"), ("memory", "activations")}


PLANNED = [  # the planner's cases of issue 26: (model, GPUs, seq_len, global batch)
    ("llama-3.1-405b", 16384, 8192, 2048),
    ("llama-3.1-70b", 64, 8192, 512),
    ("mixtral-8x7b", 64, 4096, 512),  # MoE: ep inside dp×cp, with tp and pp
    ("deepseek-v3", 2048, 4096, 4096),
]


@pytest.mark.parametrize("name, gpus, seq_len, global_batch", PLANNED, ids=[p[0] for p in PLANNED])
def test_every_top_20_candidate_shrinks_with_every_axis_and_run_hybrid_accepts_its_line(
    name, gpus, seq_len, global_batch
):
    """No axis dropped (only sizes shrink), and the printed replay line goes through ``playbook run
    hybrid``'s own parser and check, as a user would type it. cp inside a pipeline and ZeRO over
    dp×cp there used to be refused or dropped here."""
    from playbook.cli import build_parser
    from playbook.cli.checks import check_numbers
    from playbook.parallel import get
    from playbook.viz.plan_dashboard import cached_plan

    cfg = ModelConfig.preset(name)
    planned = cached_plan(name, "h100-sxm", gpus, seq_len, global_batch)
    for c in planned.candidates[:20]:
        s = shrink(c, model=cfg, max_ranks=16)
        assert {a for a in ("dp", "tp", "pp", "cp", "ep") if getattr(s.dims, a) > 1} == {
            a for a, v in c.layout.degrees.items() if v > 1
        }
        assert bool(s.zero) == bool(c.layout.zero and s.dims.dp * s.dims.cp > 1), (c.layout, s)
        lighter = [n for n in s.notes if n.startswith(f"recompute={c.layout.recompute} → {s.recompute}: ")]
        assert s.recompute == c.layout.recompute or lighter, (c.layout, s)  # carried, or lightened and said why
        args = build_parser(strategies=True).parse_args(s.command().split()[1:])
        check_numbers(args)
        get("hybrid").check(args)  # raises the one-line refusal if run hybrid would not run it
