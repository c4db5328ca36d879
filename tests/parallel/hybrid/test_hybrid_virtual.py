"""Virtual stages in the hybrid: v model chunks per pipeline rank, so interleaved 1F1B (Narayanan
et al. 2021, §2.2.2) runs with v = 2, and the V schedules ZB-V (Qi et al. 2023, §6) and DualPipe-V
(DeepSeek-AI 2024, §3.2.1; rank 0 holds the first and the last stage) run inside dp, tp, cp and
ZeRO, each against one process (loss, gradients, parameters after AdamW), with bytes per axis and
memory per category of every rank measured == predicted."""

import pytest
from hybrid_matrix import check

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.pp.run import PipelineSetup
from playbook.parallel.training import TrainSetup
from playbook.theory.pp.rank_params import chunk_ranges

SETUP = TrainSetup()  # gpt-tiny: 2 blocks, so pp2 × v2 puts one piece on each of the 4 virtual stages
LAYOUTS = [
    ("interleaved v2, ZeRO-1 in dp2×pp2", Plan(ParallelDims(dp=2, pp=2), zero=1, schedule="interleaved")),
    (
        "interleaved v2, m=4, tp2×pp2 with SP",
        Plan(ParallelDims(tp=2, pp=2), sequence_parallel=True, schedule="interleaved", microbatches=4),
    ),
    (
        "zb-v in dp2×pp2 (W from inputs and output gradients)",
        Plan(ParallelDims(dp=2, pp=2), schedule="zb-v", microbatches=2),
    ),
    (
        "zb-v in tp2×pp2 with SP",
        Plan(ParallelDims(tp=2, pp=2), sequence_parallel=True, schedule="zb-v", microbatches=2),
    ),
    ("dualpipe-v in cp2×pp2", Plan(ParallelDims(cp=2, pp=2), schedule="dualpipe-v", microbatches=4)),
]


@pytest.mark.parametrize("name, plan", LAYOUTS, ids=[n for n, _ in LAYOUTS])
def test_virtual_stages_match_one_process_with_bytes_and_memory_as_predicted(ranks4, name, plan):
    assert plan.v == 2
    check(ranks4, SETUP, plan)


def test_chunks_are_placed_as_each_schedule_places_them():
    """4 pieces (embedding, 2 blocks, head) over pp2 × v2: one each. Interleaved gives rank r stages
    r and r + 2; the V gives rank 0 the first and the last, rank 1 the two middle ones."""
    cfg = SETUP.config()
    assert chunk_ranges(cfg, 2, 0, "interleaved", 2) == [(0, 1), (2, 3)]
    assert chunk_ranges(cfg, 2, 1, "interleaved", 2) == [(1, 2), (3, 4)]
    assert chunk_ranges(cfg, 2, 0, "zb-v", 2) == [(0, 1), (3, 4)]
    assert chunk_ranges(cfg, 2, 1, "dualpipe-v", 2) == [(1, 2), (2, 3)]


def test_the_schedule_implies_the_chunks_unless_given():
    pp2 = ParallelDims(pp=2)
    assert [Plan(pp2, schedule=s).v for s in ("1f1b", "gpipe", "zb-h1", "interleaved", "zb-v", "dualpipe-v")] == [
        1,
        1,
        1,
        2,
        2,
        2,
    ]
    assert Plan(pp2, schedule="interleaved", virtual_stages=1).v == 1
    assert Plan(ParallelDims(dp=2), schedule="interleaved").v == 1  # no pipeline, no chunks


@pytest.mark.parametrize(
    "plan, words",
    [
        (Plan(ParallelDims(dp=2), virtual_stages=2), "virtual_stages=2 chunks a pipeline, and pp=1"),
        (Plan(ParallelDims(pp=2), schedule="zb-v", virtual_stages=3), "places exactly two chunks per rank"),
        (Plan(ParallelDims(pp=2), schedule="dualpipe-v", microbatches=2), "m >= 2p = 4"),
        (Plan(ParallelDims(pp=2), schedule="1f1b", virtual_stages=2), "needs the 'interleaved' schedule"),
        (Plan(ParallelDims(pp=2), schedule="interleaved", virtual_stages=3), "6 stages"),
    ],
)
def test_bad_chunks_are_refused_before_any_rank_starts(plan, words):
    with pytest.raises(ValueError, match=words):
        plan.check(SETUP)


def test_run_hybrid_takes_the_schedules_and_chunks_on_its_command_line(capsys):
    from playbook.cli import build_parser, main
    from playbook.cli.checks import check_numbers
    from playbook.parallel import get

    for line in ("--pp 2 --schedule zb-v --microbatches 2", "--pp 2 --schedule interleaved --chunks 2"):
        args = build_parser(strategies=True).parse_args(["run", "hybrid", *line.split()])
        check_numbers(args)
        get("hybrid").check(args)  # raises the one-line refusal if run hybrid would not run it
        assert Plan(ParallelDims(pp=2), schedule=args.schedule, virtual_stages=args.virtual_stages).v == 2
    assert main(["run", "hybrid", "--dp", "2", "--chunks", "2"]) == 2
    assert "--chunks cuts a pipeline's stages into virtual ones, and pp=1 here" in capsys.readouterr().err


ZERO_NOT_YET = (
    "ZeRO-"  # ZeRO-3 inside a pipeline, ZeRO-2/3 with SP: the ZeRO composition's refusals, not the schedule's
)


@pytest.mark.parametrize(
    "name, gpus, seq_len, global_batch", [("llama-3.1-405b", 16384, 8192, 2048), ("llama-3.1-70b", 64, 8192, 512)]
)
def test_run_hybrid_accepts_the_torchrun_line_plan_prints_for_its_top_candidates(name, gpus, seq_len, global_batch):
    """The planner's own output, schedule and chunks included (its top 20 use zb-v, interleaved with
    v=8 and zb-h1; 405B's 126 layers in 4 to 64 unequal stages), through ``run hybrid``'s parser and
    check, as torchrun would start it. The only refusals left are ZeRO's (named in one line)."""
    from playbook.cli import build_parser
    from playbook.cli.checks import check_numbers
    from playbook.parallel import get
    from playbook.theory.plan.launch import torchrun_command
    from playbook.viz.plan_dashboard import cached_plan

    planned = cached_plan(name, "h100-sxm", gpus, seq_len, global_batch)
    where = dict(model=name, seq_len=seq_len, global_batch=global_batch, gpus_per_node=8)
    accepted = set()
    for c in planned.candidates[:20]:
        argv = torchrun_command(c.layout, **where).split("-m playbook.cli ")[1].split("  #")[0].split()
        args = build_parser(strategies=True).parse_args(argv)
        check_numbers(args)
        try:
            get("hybrid").check(args)  # raises the one-line refusal if run hybrid would not run it
        except ValueError as e:
            assert ZERO_NOT_YET in str(e), (argv, e)
            continue
        v = c.layout.v if c.layout.schedule == "interleaved" else None
        assert (args.schedule, args.virtual_stages) == (c.layout.schedule, v)
        accepted.add(args.schedule)
    assert accepted >= {"zb-v", "zb-h1"} if name == "llama-3.1-405b" else accepted, accepted


UNEVEN = PipelineSetup(n_layers=3)  # 3 blocks: 2 + 1 over pp2; embedding, 3 blocks, head = 5 pieces over pp2 × v2
UNEVEN_LAYOUTS = [
    (
        "zb-v in tp2×pp2 with SP",
        Plan(ParallelDims(tp=2, pp=2), sequence_parallel=True, schedule="zb-v", microbatches=2),
    ),
    ("interleaved in dp2×pp2 with ZeRO-1", Plan(ParallelDims(dp=2, pp=2), zero=1, schedule="interleaved")),
]


@pytest.mark.parametrize("name, plan", UNEVEN_LAYOUTS, ids=[n for n, _ in UNEVEN_LAYOUTS])
def test_unequal_stages_match_one_process(ranks4, name, plan):
    """A pipeline whose degree does not divide the layers (Llama 3 405B: 126 layers) runs: the
    executor and the theory cut the same pieces (``theory.pp.pipeline.stage_ranges``)."""
    check(ranks4, UNEVEN, plan)
