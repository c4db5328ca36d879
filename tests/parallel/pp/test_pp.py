"""Pipeline parallelism on real ranks: every schedule, ours and torch's, against the single process;
held activations measured against the prediction to the byte; the CLI's schedule block; clear errors."""

import json

import pytest
import torch

from playbook.cli import main
from playbook.dims import ParallelDims
from playbook.measure.held import HeldActivations
from playbook.measure.pipeline import activation_report, compare_bubble, measured_timeline
from playbook.model.gpt import GPT
from playbook.parallel.pp.run import PipelineSetup, merge, on_rank, run_pp
from playbook.parallel.pp.native import native_on_rank
from playbook.parallel.pp.executor import Chunk, microbatches, run_step
from playbook.parallel.parity import assert_parity
from playbook.parallel.report import compare
from playbook.parallel.training import train
from playbook.theory.pp.pipeline import chunk_activation_bytes, chunk_w_bytes, predicted_memory
from playbook.theory.pp.simulator import held_bytes
from playbook.theory.pp.schedules import make_schedule

TINY = PipelineSetup(model="gpt-tiny", steps=3, global_batch=8, seq_len=16)  # 2 layers: 4 pieces
DEEP = PipelineSetup(model="gpt-tiny", steps=3, global_batch=8, seq_len=16, n_layers=6)  # 8 pieces: 4 ranks × 2 chunks
CASES = {  # (schedule, v, micro-batch counts): m a multiple of p for interleaved, m >= 2p for dualpipe-v
    2: [
        ("gpipe", 1, (2, 8)),
        ("1f1b", 1, (1, 4, 8)),
        ("interleaved", 2, (2, 4)),
        ("zb-h1", 1, (2, 8)),
        ("zb-v", 2, (2, 8)),
        ("dualpipe-v", 2, (4, 8)),
    ],
    4: [
        ("gpipe", 1, (4, 8)),
        ("1f1b", 1, (2, 8)),
        ("interleaved", 2, (4, 8)),
        ("zb-h1", 1, (4, 8)),
        ("zb-v", 2, (2, 8)),
        ("dualpipe-v", 2, (8,)),
    ],
}
_refs: dict = {}


def reference(setup):
    if setup not in _refs:
        _refs[setup] = train(setup)
    return _refs[setup]


def check_parity(result, setup):
    """Loss, every gradient (a missing 1/m or a lost micro-batch is O(1)) and parameters after 3 AdamW
    steps as relative L2 per tensor, each within max(1e-5, 3x the float floor) (``parallel.parity``).
    Adam divides each element's step by its own |g|: an element whose gradient is ~1e-9 (1e-6 of the
    tensor's largest) moves by ~lr whatever its rounding noise says, so the worst element differs by
    ~1e-3 of a tensor's scale (max_rel_param_diff, information only). On DEEP one float32 process is
    itself ~5e-5 from float64 (mlp.down_proj of the 6 layers), which the floor measures."""
    parity = compare(result, reference(setup))
    assert_parity(parity, setup)
    return parity


@pytest.mark.parametrize("p", [2, 4])
def test_our_executor_matches_the_single_process_for_every_schedule(p, ranks2, ranks4):
    cluster = ranks2 if p == 2 else ranks4
    setup = TINY if p == 2 else DEEP
    for name, v, ms in CASES[p]:
        for m in ms:
            results = cluster.run(on_rank, setup, schedule=name, m=m, v=v, progress=False)
            ours = merge(results)
            assert sorted(ours.grads) == sorted(reference(setup).grads)  # every parameter, once
            check_parity(ours, setup)
            # held activations: measured by saved-tensor hooks == the order × the exact count per chunk
            act = activation_report(results, make_schedule(name, p, m, v), setup)
            assert act["measured_bytes"] == act["predicted_bytes"], (name, m, act)
            assert [list(d.values()) for d in act["chunk_bytes_measured"]] == act["chunk_bytes_predicted"]


@pytest.mark.parametrize("p", [2, 4])
def test_native_pipelining_matches_the_single_process(p, ranks2, ranks4):
    cluster = ranks2 if p == 2 else ranks4
    setup = TINY if p == 2 else DEEP
    for name, v, ms in CASES[p]:
        m = ms[-1]
        check_parity(merge(cluster.run(native_on_rank, setup, schedule=name, m=m, v=v, progress=False)), setup)


def test_blocking_receives_give_the_same_result(ranks2):
    """Receives posted only where the list has them (plain recv) instead of up front (irecv)."""
    results = ranks2.run(on_rank, TINY, schedule="interleaved", m=4, v=2, prepost=False, progress=False)
    check_parity(merge(results), TINY)
    assert sum(1 for s in ranks2.last_trace if s["name"] == "recv") == TINY.steps * 2 * 4 * (2 * 2 - 1)
    assert not any(s["name"] == "irecv" for s in ranks2.last_trace)
    # the default group is the pp axis of ParallelDims(pp=2): every message is traced on that axis
    assert {s["axis"] for s in ranks2.last_trace if s["kind"] == "comm"} == {"pp"}


def _two_pipelines(ctx, setup):
    mesh = ctx.mesh_for(ParallelDims(dp=2, pp=2))  # pp groups [0, 2] and [1, 3]
    return on_rank(ctx, setup, schedule="1f1b", m=4, group=mesh.group("pp")) | {"pipeline": mesh.coords["dp"]}


def test_two_pipelines_side_by_side_each_in_its_own_group(ranks4):
    """Group-local peers become global ranks where messages are sent: pipeline [1, 3] talks to 3, not to 1."""
    results = ranks4.run(_two_pipelines, TINY, progress=False)
    for pipeline in (0, 1):
        check_parity(merge([r for r in results if r["pipeline"] == pipeline]), TINY)


def test_peak_activations_1f1b_p_gpipe_m(ranks2):
    setup, m = TINY, 8
    chunk0 = chunk_activation_bytes(setup.config(), 0, 2, setup.global_batch // m, setup.seq_len)  # embedding + 1 block
    got = {}
    for name in ("gpipe", "1f1b"):
        results = ranks2.run(on_rank, setup, schedule=name, m=m, progress=False)
        got[name] = activation_report(results, make_schedule(name, 2, m), setup)["measured_bytes"][0]
    assert got["gpipe"] == m * chunk0  # all m micro-batches wait for their backward
    assert got["1f1b"] == 2 * chunk0  # rank 0 of p = 2 holds p


def test_held_bytes_release_the_w_part_at_w():
    # zb-h1, p = 2, m = 8 (Qi et al. §2.1): rank 0 plays F0 F1 B0 W0 F2 B1 W1 ... (2 whole sets at its
    # peak), rank 1 F0 B0 F1 B1 W0 F2 B2 W1 ... (W one micro-batch late: 1 whole set and 1 W part).
    # Sets of 10 and 7 bytes, of which 3 and 2 stay for W:
    s = make_schedule("zb-h1", 2, 8)
    assert s.table() == [
        "rank 0: F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 F4 B3 W3 F5 B4 W4 F6 B5 W5 F7 B6 W6 B7 W7",
        "rank 1: F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 F4 B4 W3 F5 B5 W4 F6 B6 W5 F7 B7 W6 W7",
    ]
    assert held_bytes(s, [[10], [7]], [[3], [2]]) == [2 * 10, 7 + 2]
    assert held_bytes(s, [[10], [7]]) == [2 * 10, 2 * 7]  # w_bytes=None: the whole set stays until W


def test_zb_h1_keeps_only_what_w_needs_until_w(ranks2):
    """Qi et al. 2023 §2: between B and W a micro-batch keeps each linear's input and its output
    gradient, not its graph. By hand, gpt-tiny (h 64, a 4 heads, g 2 KV heads, d 16, f 176) at b = 1,
    s = 16: a block keeps 16·(8·64 + 2·64 + 2·32 + 3·176)·4 = 78,848 bytes, the embedding its token
    ids and output gradient 16·8 + 16·64·4 = 4,224, the head 16·(3·64 + 64)·4 = 16,384."""
    setup, m = TINY, 8
    cfg = setup.config()
    w = [4_224 + 78_848, 78_848 + 16_384]  # rank 0: embedding + block 0; rank 1: block 1 + head
    assert [chunk_w_bytes(cfg, 0, 2, 1, 16), chunk_w_bytes(cfg, 2, 4, 1, 16)] == w
    f = [chunk_activation_bytes(cfg, 0, 2, 1, 16), chunk_activation_bytes(cfg, 2, 4, 1, 16)]
    results = ranks2.run(on_rank, setup, schedule="zb-h1", m=m, progress=False)
    schedule = make_schedule("zb-h1", 2, m)
    want = [2 * f[0], f[1] + w[1]]  # the orders above: rank 1 keeps one W part beside its whole set
    for step in range(setup.steps):
        assert [r["logs"][step].peak_bytes for r in results] == want
    assert [r["logs"][0].chunk_bytes[0] for r in results] == f
    assert [predicted_memory(setup, schedule, r)["activations"] for r in (0, 1)] == want
    assert f[1] + w[1] < 2 * f[1]  # less than a whole graph until W
    check_parity(merge(results), setup)


def test_bubble_report_has_both_definitions(ranks2):
    results = ranks2.run(on_rank, TINY, schedule="1f1b", m=4, progress=False)
    rep = compare_bubble(results, make_schedule("1f1b", 2, 4))
    assert set(rep["definition"]) == {"idle_over_total", "bubble_over_ideal"}
    for x in (rep["bubble_predicted"], measured_timeline(results, 1).bubble()):
        assert 0 < x["idle_over_total"] < 1
        y = x["bubble_over_ideal"]  # one timeline's two definitions are tied: idle/total = y/(1+y)
        assert x["idle_over_total"] == pytest.approx(y / (1 + y), rel=1e-9)
    # each measured step has every rank's 4 F and 4 B, in the order of the schedule
    tl = measured_timeline(results, 1)
    for r in range(2):
        order = [(s.kind, s.mb) for s in sorted(tl.slots, key=lambda s: s.start) if s.rank == r]
        assert order == [(a.kind, a.mb) for a in make_schedule("1f1b", 2, 4).compute(r)]


def test_zb_h1_on_four_ranks_holds_1f1b_peak_greedy_more(ranks4):
    """Qi et al. 2023 §2.1 on real ranks, p = 4, m = 8: rank r of ZB-H1 holds at most p − r whole sets
    and r W parts, (p − r)·f_r + r·w_r bytes, so rank 0 holds exactly what 1F1B's rank 0 holds; the
    greedy variant keeps 7, 6, 5, 4 sets until their W. Measured by saved-tensor hooks, to the byte."""
    setup, p, m = DEEP, 4, 8
    cfg, b = setup.config(), setup.global_batch // m
    got = {}
    for name in ("1f1b", "zb-h1", "zb-h1-greedy"):
        results = ranks4.run(on_rank, setup, schedule=name, m=m, progress=False)
        got[name] = activation_report(results, make_schedule(name, p, m), setup)
        assert got[name]["measured_bytes"] == got[name]["predicted_bytes"], name
        if name == "zb-h1":
            check_parity(merge(results), setup)
            ranges = [r["ranges"][0] for r in results]
    f = [chunk_activation_bytes(cfg, *rg, b, setup.seq_len) for rg in ranges]
    w = [chunk_w_bytes(cfg, *rg, b, setup.seq_len) for rg in ranges]
    assert got["zb-h1"]["measured_bytes"] == [(p - r) * f[r] + r * w[r] for r in range(p)]
    assert got["zb-h1"]["measured_bytes"][0] == got["1f1b"]["measured_bytes"][0] == p * f[0]
    assert got["zb-h1"]["peak_held"] == [p] * p and got["zb-h1-greedy"]["peak_held"] == [7, 6, 5, 4]
    assert all(g > z for g, z in zip(got["zb-h1-greedy"]["measured_bytes"][:3], got["zb-h1"]["measured_bytes"]))


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_bubble_prediction_replays_the_measured_busy_time(name, ranks2):
    """compare_bubble simulates the schedule with the run's own mean F, B (and W) per stage
    (measured_costs): then every rank's simulated busy time is its measured busy time, averaged over
    the steps compared, and the two bubbles differ only by waiting. By hand: rank r's busy time is
    Σ over its stages of m·(f + b + w), and m·mean = the sum of that stage's slots in one step, on average."""
    from playbook.measure.pipeline import measured_costs
    from playbook.theory.pp.simulator import simulate

    schedule = make_schedule(name, 2, 4)
    results = ranks2.run(on_rank, TINY, schedule=name, m=4, v=1, progress=False)
    steps = range(1, TINY.steps)  # compare_bubble's default: every step after the first
    measured = [sum(measured_timeline(results, st).busy()[r] for st in steps) / len(steps) for r in range(2)]
    by_hand = [
        sum(s.end - s.start for st in steps for s in results[r]["logs"][st].slots) / len(steps) for r in range(2)
    ]
    assert measured == pytest.approx(by_hand, rel=1e-12)
    predicted = simulate(schedule, measured_costs(results, schedule)).busy()
    assert predicted == pytest.approx(measured, rel=1e-9)  # per rank, to float rounding
    # and compare_bubble's own numbers obey it: Σ busy = p · makespan · (1 − idle/total)
    rep = compare_bubble(results, schedule)
    total_busy = 2 * rep["makespan_predicted_s"] * (1 - rep["bubble_predicted"]["idle_over_total"])
    assert total_busy == pytest.approx(sum(measured), rel=1e-9)
    assert rep["bubble_predicted"]["bubble_over_ideal"] == pytest.approx(
        (2 * rep["makespan_predicted_s"] - sum(measured)) / sum(measured), rel=1e-9
    )


def test_split_backward_on_one_process_equals_full_backward():
    """B (input and module-output gradients) + W (weights, one node deep) == loss.backward()."""
    setup = TINY
    cfg = setup.config()
    grads = {}
    for name in ("1f1b", "zb-h1"):
        model = GPT(cfg, seed=0)
        chunk = Chunk(model, 0, cfg.n_layers + 2, global_tokens=setup.global_batch * setup.seq_len)
        tokens, targets = microbatches(setup, 0, 2, "cpu")
        held = HeldActivations(model)
        run_step(make_schedule(name, 1, 2), 0, [chunk], tokens, targets, (4, 16, cfg.hidden), None, held)
        assert held.now == 0  # everything autograd saved was freed
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n in grads["1f1b"]:
        torch.testing.assert_close(grads["zb-h1"][n], grads["1f1b"][n], rtol=1e-5, atol=1e-7)


def test_cli_prints_a_schedule_block(capsys):
    code = main(
        ["run", "pp", "--world-size", "2", "--schedule", "zb-h1", "--microbatches", "4", "--steps", "2", "--json"]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["strategy"] == "pp" and report["world_size"] == 2
    s = report["schedule"]
    assert s["name"] == "zb-h1" and {"bubble_predicted", "bubble_measured", "definition"} <= set(s)
    assert report["parity"]["within_bounds"] is True
    assert report["native"]["max_rel_grad_diff"] <= report["parity"]["bounds"]["max_rel_grad_diff"]
    assert s["activations"]["measured_bytes"] == s["activations"]["predicted_bytes"]
    for k in ("params", "grads", "optimizer", "activations"):  # rank 0's stage, to the byte
        assert report["memory"]["measured"][k] == report["memory"]["predicted"][k], k
    cfg = TINY.config()  # by hand: embedding + 1 block (of 2), fp32, AdamW with 1 + 9 tensors
    n = cfg.vocab_size * cfg.hidden + cfg.layer_params()
    assert report["memory"]["predicted"]["params"] == 4 * n
    assert report["memory"]["predicted"]["optimizer"] == 8 * n + 4 * 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(world_size=4, schedule="interleaved", microbatches=6, chunks=2), "m must be a multiple of p"),
        (dict(world_size=4, schedule="interleaved", microbatches=4, chunks=2), "use p·v <= 4"),
        (dict(world_size=2, schedule="interleaved", microbatches=4, chunks=0), "v (chunks per rank) must be"),
        (dict(world_size=2, schedule="1f1b", microbatches=3), "do not split global_batch=8"),
    ],
)
def test_bad_input_is_refused_before_any_rank_starts(kwargs, message):
    with pytest.raises(ValueError) as err:
        run_pp(TINY, backend="gloo", **kwargs)
    assert message in str(err.value)


TIED = PipelineSetup(model="gpt-tiny-tied", steps=3, global_batch=8, seq_len=16)


@pytest.mark.parametrize("name, v, m", [("1f1b", 1, 4), ("interleaved", 2, 4), ("zb-v", 2, 2)])
def test_a_tied_embedding_is_summed_over_its_first_and_last_stage(ranks2, name, v, m):
    """The lookup's gradient (first stage) and the projection's (last) summed on both copies, one
    exchange of [vocab, hidden] each way; on the V rank 0 holds both and nothing more is sent."""
    results = ranks2.run(on_rank, TIED, schedule=name, m=m, v=v, progress=False)
    check_parity(merge(results), TIED)
    assert all("lm_head.weight" not in r["params"] for r in results)  # reported under tok_emb.weight
    tied = [s for s in ranks2.last_trace if s["kind"] == "comm" and s["axis"] == "embed"]
    sends = [s for s in tied if s["name"] == "isend"]
    assert len(sends) == (0 if name == "zb-v" else 2 * TIED.steps) and all(s["bytes"] == 4 * 64 * 64 for s in sends)
    if name != "zb-v":  # the two copies stay bit-for-bit equal
        assert torch.equal(results[0]["params"]["tok_emb.weight"], results[1]["params"]["tok_emb.weight"])


def _two_tied_pipelines(ctx, setup):
    mesh = ctx.mesh_for(ParallelDims(dp=2, pp=2))  # pp groups [0, 2] and [1, 3]
    return on_rank(ctx, setup, schedule="1f1b", m=4, group=mesh.group("pp")) | {"pipeline": mesh.coords["dp"]}


def test_two_tied_pipelines_side_by_side_exchange_with_their_own_other_end(ranks4):
    """Issue 48, near-miss 4: the tied embedding's exchange (``parallel.tied.sum_with_peer``) takes a
    pipeline-local peer; pipeline [0, 2]'s rank 0 must send to global rank 2, not to 1 (the other
    pipeline's first stage). One pipeline alone (``ranks2``) cannot tell the two apart."""
    results = ranks4.run(_two_tied_pipelines, TIED, progress=False)
    for pipeline in (0, 1):
        mine = [r for r in results if r["pipeline"] == pipeline]
        check_parity(merge(mine), TIED)
        assert torch.equal(mine[0]["params"]["tok_emb.weight"], mine[1]["params"]["tok_emb.weight"])


def test_dualpipe_v_measured_pairs_wait_for_both_inputs_and_replay_in_the_simulator(ranks2):
    """DualPipe-V on real ranks plays the simulator's order, and each overlapped F&B pair is one unit as
    ``theory.pp.v`` says (issue 41, cause 7): on the measured clock (perf_counter, one clock for every
    process here) its F starts only after both its F's input and its B's output-gradient were produced
    on the neighbouring stages. The simulator fed the run's own mean costs gives each rank's busy time."""
    from playbook.measure.pipeline import measured_costs
    from playbook.theory.pp.simulator import simulate
    from playbook.theory.pp.v import v_pairs

    p, m = 2, 4
    schedule = make_schedule("dualpipe-v", p, m, 2)
    results = ranks2.run(on_rank, TINY, schedule="dualpipe-v", m=m, v=2, progress=False)
    pairs = v_pairs("dualpipe-v", p, m)
    assert sum(map(len, pairs)) >= 3
    waited = 0
    for step in range(1, TINY.steps):
        slots = [s for r in results for s in r["logs"][step].slots]
        at = {(s.kind, s.mb, schedule.stage(s.rank, s.chunk)): s for s in slots}
        for r in range(p):
            mine = sorted((s for s in slots if s.rank == r), key=lambda s: s.start)
            assert [(s.kind, s.mb, s.chunk) for s in mine] == [(a.kind, a.mb, a.chunk) for a in schedule.compute(r)]
            for k in pairs[r]:
                f, b = mine[k], mine[k + 1]
                assert (f.kind, b.kind) == ("F", "B") and f.chunk != b.chunk
                j, i = schedule.stage(r, f.chunk), schedule.stage(r, b.chunk)
                inputs = [x for x in (at.get(("F", f.mb, j - 1)), at.get(("B", b.mb, i + 1))) if x and x.rank != r]
                assert f.start >= max((x.end for x in inputs), default=f.start)
                waited += any(x.kind == "B" for x in inputs)  # the B's gradient, from the other rank
    assert waited >= TINY.steps - 1  # every step has pairs whose B input crosses ranks
    steps = range(1, TINY.steps)
    measured = [sum(measured_timeline(results, st).busy()[r] for st in steps) / len(steps) for r in range(p)]
    assert simulate(schedule, measured_costs(results, schedule)).busy() == pytest.approx(measured, rel=1e-9)
