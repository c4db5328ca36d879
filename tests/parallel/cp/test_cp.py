"""Context parallelism: the layout and counts by hand, attention parity for every variant, the whole
model against the single process, and bytes, memory and work measured == predicted."""

import json
import math

import pytest
import torch

from playbook.cli import main
from playbook.config import ModelConfig
from playbook.parallel.cp.run import check, on_rank, predicted_memory, run_cp, train_cp
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup, train
from playbook.parallel.parity import assert_parity, floor_of
from playbook.theory import cp as th
from playbook.theory.inventory.activations import model_activation_bytes

TINY = ModelConfig.preset("gpt-tiny")  # 4 heads, 2 kv heads, head_dim 16, 2 layers
SETUP = TrainSetup(model="gpt-tiny", steps=3, global_batch=4, seq_len=32)
SMALL = TrainSetup(model="gpt-small", steps=3, global_batch=4, seq_len=32)  # 8 heads, 4 kv heads: Ulysses at n=4


# ---- theory, by hand ------------------------------------------------------------------------------
def test_layouts_by_hand():
    assert th.shard_chunks(4, zigzag=False) == [[0], [1], [2], [3]]
    assert th.shard_chunks(4, zigzag=True) == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert th.shard_positions(8, 2, 1, zigzag=False) == [4, 5, 6, 7]
    assert th.shard_positions(8, 2, 0, zigzag=True) == [0, 1, 6, 7]
    assert th.shard_positions(8, 2, 1, zigzag=True) == [2, 3, 4, 5]
    every = sorted(p for r in range(4) for p in th.shard_positions(16, 4, r, zigzag=True))
    assert every == list(range(16))


def test_ring_block_counts_by_hand():
    # contiguous n=4, causal: rank i sees its own diagonal block and the i blocks before it
    assert th.ring_blocks_per_rank(4, zigzag=False) == [1, 2, 3, 4]
    # zig-zag n=2: rank 0 holds chunks {0, 3}, rank 1 {1, 2}. Rank 0, step 0 (own): (0,0) (3,0) (3,3);
    # step 1 (chunks 1, 2): (3,1) (3,2) -> 5. Rank 1: (1,1) (2,1) (2,2); then (1,0) (2,0) -> 5.
    sched = th.ring_schedule(2, zigzag=True)
    assert sorted((b.q_chunk, b.k_chunk) for b in sched if b.rank == 0) == [(0, 0), (3, 0), (3, 1), (3, 2), (3, 3)]
    assert sorted((b.q_chunk, b.k_chunk) for b in sched if b.rank == 1) == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    for n in (1, 2, 3, 4, 8):
        for zz in (False, True):
            for causal in (False, True):
                counts = [sum(b.rank == r for b in th.ring_schedule(n, zz, causal)) for r in range(n)]
                assert counts == th.ring_blocks_per_rank(n, zz, causal)
    # every unmasked query/key chunk pair is computed exactly once, by the rank owning the query
    sched = th.ring_schedule(4, zigzag=True)
    assert len({(b.q_chunk, b.k_chunk) for b in sched}) == len(sched) == 8 * 9 // 2


def test_zigzag_balances_work_and_contiguous_does_not():
    contiguous, zigzag = th.ring_work_per_rank(64, 4, False), th.ring_work_per_rank(64, 4, True)
    assert contiguous == [16 * 16 * k for k in (1, 2, 3, 4)]  # (s/n)^2 per block
    assert zigzag == [8 * 8 * 9] * 4  # 2n+1 blocks of (s/2n)^2
    assert th.imbalance(zigzag) == 0.0 and th.imbalance(contiguous) == pytest.approx(4 / 2.5 - 1)


def test_bytes_per_layer_by_hand():
    b, s, n = 4, 32, 2
    kv = 2 * b * 2 * (s // n) * 16 * 4  # K and V of one shard: 2 kv heads, head_dim 16, fp32
    ring = th.comm_bytes_per_layer(TINY, seq_len=s, micro_batch=b, cp=n, variant="ring")
    assert ring == {"batch_isend_irecv": 3 * (n - 1) * kv}
    ag = th.comm_bytes_per_layer(TINY, seq_len=s, micro_batch=b, cp=n, variant="allgather")
    assert ag == {"all_gather_single": (n - 1) * kv, "reduce_scatter_single": (n - 1) * kv}
    q = b * 4 * (s // n) * 16 * 4
    uly = th.comm_bytes_per_layer(TINY, seq_len=s, micro_batch=b, cp=n, variant="ulysses")
    assert uly == {"all_to_all_single": 2 * 0.5 * (q + kv + q)}  # q, k, v, out forward; their grads backward
    assert th.comm_bytes_per_layer(TINY, seq_len=s, micro_batch=b, cp=1, variant="ring") == {}
    # in bf16 the ring's K/V halve, but the gradients it passes are fp32
    bf16 = th.comm_bytes_per_layer(TINY, seq_len=s, micro_batch=b, cp=n, variant="ring", dtype_bytes=2)
    assert bf16 == {"batch_isend_irecv": (n - 1) * (2 * kv / 2 + kv)}


def test_allgather_at_cp1_is_the_model_count_plus_explicit_rope_positions():
    # an independent check against playbook.theory.inventory.activations: with one rank, all-gather attention
    # is the reference's attention; explicit positions add cos and sin for q and k (4·s·d per block)
    s, b = 32, 4
    ours = th.cp_activation_bytes(TINY, seq_len=s, micro_batch=b, cp=1, variant="allgather")
    assert ours == model_activation_bytes(TINY, seq_len=s, micro_batch=b) + TINY.n_layers * 4 * s * 16 * 4


def test_overlap_condition():
    h100 = dict(peak_flops=989.4e12, bandwidth=450e9)
    cfg = ModelConfig.preset("llama-3.1-8b")  # 32 heads, 8 kv heads
    # c >= g·B·peak / (2·a·bw) = 8·2·989.4e12 / (2·32·450e9) ≈ 550 tokens
    small = th.overlap(cfg, seq_len=8 * 256, micro_batch=1, cp=8, **h100)
    big = th.overlap(cfg, seq_len=8 * 4096, micro_batch=1, cp=8, **h100)
    assert small.min_shard_tokens == pytest.approx(8 * 2 * 989.4e12 / (2 * 32 * 450e9))
    assert not small.hidden and big.hidden


@pytest.mark.parametrize(
    "setup, n, variant, zigzag, message",
    [
        (TrainSetup(seq_len=30), 4, "ring", False, "seq_len=30 does not split into cp = 4 shards"),
        (TrainSetup(seq_len=36), 4, "ring", True, "a multiple of 8"),
        (SETUP, 4, "ulysses", False, "cp=4 must divide n_heads=4 and n_kv_heads=2; try cp in {1, 2}"),
        (SETUP, 2, "tree", False, "variant must be one of ring, allgather, ulysses"),
    ],
)
def test_bad_layouts_are_refused_before_any_rank_starts(setup, n, variant, zigzag, message):
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}").replace("(", r"\(")):
        check(setup, n, variant, zigzag)
    with pytest.raises(ValueError):
        run_cp(setup, world_size=n, backend="gloo", variant=variant, zigzag=zigzag)


# ---- attention alone, on real ranks --------------------------------------------------------------
def _attention_parity(ctx, cases):
    """Every case on this rank: max abs error of output and of dq, dk, dv against full attention (fp64)."""
    from playbook.parallel.cp.ring_attention import VARIANTS, attention
    from playbook.theory.cp import shard_positions

    errors = []
    for variant, zigzag, causal, g in cases:
        gen = torch.Generator().manual_seed(1)
        b, a, s, d = 2, 4, 16, 8
        q, dout = (
            torch.randn(b, a, s, d, generator=gen, dtype=torch.float64),
            torch.randn(b, a, s, d, generator=gen, dtype=torch.float64),
        )
        k, v = (torch.randn(b, g, s, d, generator=gen, dtype=torch.float64) for _ in range(2))
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        want = attention(*full, torch.arange(s), torch.arange(s), causal)
        want.backward(dout)
        mine = torch.tensor(shard_positions(s, ctx.world_size, ctx.rank, zigzag))
        local = [t[:, :, mine].clone().requires_grad_() for t in (q, k, v)]
        got = VARIANTS[variant](*local, ctx.group, zigzag=zigzag, causal=causal)
        got.backward(dout[:, :, mine])
        errs = [(got - want[:, :, mine]).abs().max()] + [
            (x.grad - f.grad[:, :, mine]).abs().max() for x, f in zip(local, full)
        ]
        errors.append(max(float(e) for e in errs))
    return errors


@pytest.mark.parametrize("n", [2, 4])
def test_attention_parity_every_variant(n, ranks2, ranks4):
    ranks = ranks2 if n == 2 else ranks4
    cases = [
        (v, zz, causal, 4 if v == "ulysses" and n == 4 else 2)  # Ulysses at n=4 needs 4 kv heads
        for v in ("ring", "allgather", "ulysses")
        for zz in (False, True)
        for causal in (True, False)
    ]
    results = ranks.run(_attention_parity, cases)
    worst = [max(r[i] for r in results) for i in range(len(cases))]
    for case, err in zip(cases, worst):
        assert err < 1e-12, case  # float64: exact up to rounding (fp32 statistics would show ~1e-7)


def _ring_on_large_scores(ctx, zigzag, causal):
    """Ring attention in float64 on scores around 1000 (q·kᵀ/√d = 1000 + O(1)): exp(1000) overflows
    float64 (max ~709), so only a log-sum-exp merge that subtracts the running max survives."""
    from playbook.parallel.cp.ring_attention import attention, ring_attention
    from playbook.theory.cp import shard_positions

    gen = torch.Generator().manual_seed(2)
    b, a, g, s, d = 2, 4, 2, 16, 8
    q, dout = (torch.randn(b, a, s, d, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(b, g, s, d, generator=gen, dtype=torch.float64) for _ in range(2))
    big = math.sqrt(1000 * math.sqrt(d))  # q₀ = k₀ = big: every score gets big²/√d = 1000 on top
    q[..., 0], k[..., 0] = big, big
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = attention(*full, torch.arange(s), torch.arange(s), causal)
    want.backward(dout)
    mine = torch.tensor(shard_positions(s, ctx.world_size, ctx.rank, zigzag))
    local = [t[:, :, mine].clone().requires_grad_() for t in (q, k, v)]
    got = ring_attention(*local, ctx.group, zigzag=zigzag, causal=causal)
    got.backward(dout[:, :, mine])
    scores = (q @ k.repeat_interleave(2, 1).transpose(-2, -1)) / math.sqrt(d)
    return (
        float(scores.min()),
        float(scores.max()),
        [(got.detach(), want.detach()[:, :, mine])] + [(x.grad, f.grad[:, :, mine]) for x, f in zip(local, full)],
    )


@pytest.mark.parametrize("zigzag,causal", [(False, True), (True, True), (False, False)])
def test_ring_attention_in_float64_on_scores_near_1000(zigzag, causal, ranks2):
    for lo, hi, pairs in ranks2.run(_ring_on_large_scores, zigzag, causal):
        assert 950 < lo and hi < 1050  # the setting: every score near 1e3
        for got, want in pairs:  # output, dq, dk, dv
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def _ring_in_bf16(ctx, b, s):
    """One forward and backward of ring attention on bf16 shards, TINY's head layout (4 heads, 2 kv, d 16)."""
    from playbook.parallel.cp.ring_attention import ring_attention

    gen = torch.Generator().manual_seed(3)
    sl = s // ctx.world_size
    q = torch.randn(b, 4, sl, 16, generator=gen).to(torch.bfloat16).requires_grad_()
    k, v = (torch.randn(b, 2, sl, 16, generator=gen).to(torch.bfloat16).requires_grad_() for _ in range(2))
    out = ring_attention(q, k, v, ctx.group, zigzag=True)
    lse = out.grad_fn.saved_tensors[-1]  # RingAttention saves (q, k, v, out, lse)
    out.float().sum().backward()
    return out.dtype, lse.dtype, lse.shape, (q.grad.dtype, k.grad.dtype, v.grad.dtype)


def test_ring_attention_in_bf16_sends_2_byte_kv_and_keeps_fp32_statistics(ranks2):
    b, s, n = 4, 32, 2
    results = ranks2.run(_ring_in_bf16, b, s)
    for out_dtype, lse_dtype, lse_shape, grads in results:
        assert out_dtype == torch.bfloat16 and grads == (torch.bfloat16,) * 3
        # the running log-sum-exp (one per query row) is fp32: in bf16 a value near 5 is off by up to 1/64
        assert lse_dtype == torch.float32 and lse_shape == (b, 4, s // n)
    kv_bf16 = 2 * b * 2 * (s // n) * 16 * 2  # K and V of one shard at 2 bytes: 2 kv heads, head_dim 16
    assert th.kv_shard_bytes(TINY, seq_len=s, micro_batch=b, cp=n, dtype_bytes=2) == kv_bf16
    for r in range(n):
        spans = [x for x in ranks2.last_trace if x["kind"] == "comm" and x["rank"] == r]
        sent = {}
        for x in spans:
            sent[x["dtype"]] = sent.get(x["dtype"], 0) + x["sent_bytes"]
        # K/V go round the ring n-1 times forward and n-1 times backward, in bf16; their gradients, fp32
        assert sent == {"torch.bfloat16": 2 * (n - 1) * kv_bf16, "torch.float32": (n - 1) * 2 * kv_bf16}
        assert (
            sum(sent.values())
            == th.comm_bytes_per_layer(TINY, seq_len=s, micro_batch=b, cp=n, variant="ring", dtype_bytes=2)[
                "batch_isend_irecv"
            ]
        )


# ---- the whole model -----------------------------------------------------------------------------
WHOLE = [
    (v, zz, causal)
    for v in ("ring", "allgather", "ulysses")
    for zz, causal in ((False, True), (True, True), (False, False))
]


def test_our_forward_is_the_models_forward():
    # the CP forward is rebuilt from the model's pieces; on one process it must be GPT.forward, bit for bit
    p = compare(train_cp(SETUP), train(SETUP))
    assert p["max_abs_loss_diff"] == p["max_rel_grad_diff"] == p["max_rel_l2_param_diff"] == 0.0


@pytest.fixture(scope="module")
def references():
    cache = {}

    def get(setup, causal, dtype=torch.float32):
        if (setup, causal, dtype) not in cache:
            cache[setup, causal, dtype] = (
                train(setup) if causal and dtype == torch.float32 else train_cp(setup, causal=causal, dtype=dtype)
            )
        return cache[setup, causal, dtype]

    return get


@pytest.mark.parametrize("n", [2, 4])
def test_whole_model_parity_in_float64(n, ranks2, ranks4, references):
    """Float64 takes rounding out: the loss, every gradient and the parameters after 3 AdamW steps
    must equal the single process to ~1e-12. (In float32 Adam amplifies rounding in elements whose
    gradient is ~eps, so parameters differ ~1e-3 there, exactly as float32 vs float64 of the same
    single process does; the float32 test below checks against the model's own training loop.)"""
    ranks = ranks2 if n == 2 else ranks4
    for variant, zigzag, causal in WHOLE:
        setup = SMALL if variant == "ulysses" and n == 4 else SETUP
        results = ranks.run(on_rank, setup, variant=variant, zigzag=zigzag, causal=causal, dtype=torch.float64)
        p = compare(results[0], references(setup, causal, torch.float64))
        what = f"n={n} {variant} zigzag={zigzag} causal={causal}: {p}"
        assert (
            p["max_abs_loss_diff"] < 1e-12 and p["max_rel_grad_diff"] < 1e-10 and p["max_rel_l2_param_diff"] < 1e-9
        ), what
        assert all(r.losses == results[0].losses for r in results)  # the summed loss, on every rank


@pytest.mark.parametrize("n", [2, 4])
def test_whole_model_float32_memory_and_bytes(n, ranks2, ranks4, references):
    ranks = ranks2 if n == 2 else ranks4
    for variant, zigzag, causal in [
        (v, zz, c) for v in ("ring", "allgather", "ulysses") for zz, c in ((True, True), (False, False))
    ]:
        setup = SMALL if variant == "ulysses" and n == 4 else SETUP
        results = ranks.run(on_rank, setup, variant=variant, zigzag=zigzag, causal=causal)
        what = f"n={n} {variant} zigzag={zigzag} causal={causal}"
        p = compare(results[0], references(setup, causal))  # causal: the ordinary training loop, train()
        # loss, gradients, parameters after 3 AdamW steps (relative L2 per tensor), each within
        # max(1e-5, 3x the float floor): one float32 process is itself ~1e-5 from float64 (Adam turns
        # rounding-level gradient elements into ~lr steps): gpt-tiny at global batch 4, causal, ~1.7e-5;
        # gpt-small ~4.6e-5. Two float32 runs, each about one floor from exact; a bug moves a tensor by ~1e-2.
        assert_parity(p, what=what, floor=floor_of(references(setup, causal), references(setup, causal, torch.float64)))
        # memory: every category measured == predicted, to the byte, on every rank
        want = predicted_memory(setup, n, variant, causal)
        for r in results:
            assert {k: r.memory[k] for k in want} == want, what
        # bytes sent per step, by op, on every rank == predicted
        cfg = setup.config()
        comm = th.comm_bytes_per_step(cfg, seq_len=setup.seq_len, micro_batch=setup.global_batch, cp=n, variant=variant)
        for r in results:
            assert r.sent_per_step == comm, what


def test_activation_memory_falls_as_one_over_n(rank_sets, ranks2, ranks4):
    measured = {
        n: r.run(on_rank, SETUP, variant="ring", zigzag=True)[0].memory["activations"]
        for n, r in ((2, ranks2), (4, ranks4))
    }
    # all but the 4-byte loss scalar halves when n doubles
    assert measured[4] - 4 == pytest.approx((measured[2] - 4) / 2, rel=0, abs=0)


@pytest.mark.parametrize("n", [2, 4])
def test_ring_work_per_rank_measured_equals_predicted(n, ranks2, ranks4):
    from playbook.parallel.cp.work import ring_work_on_rank

    ranks = ranks2 if n == 2 else ranks4
    for zigzag in (False, True):
        out = ranks.run(ring_work_on_rank, seq_len=16 * n, zigzag=zigzag, repeats=1, warmup=0)
        assert [len(o["blocks"]) for o in out] == th.ring_blocks_per_rank(n, zigzag)
        assert [o["elements"] for o in out] == th.ring_work_per_rank(16 * n, n, zigzag)
        for r, o in enumerate(out):  # and the very blocks of the schedule, step by step
            got = [(b["step"], b["q_chunk"], b["k_chunk"], b["diagonal"]) for b in o["blocks"]]
            assert got == [
                (b.step, b.q_chunk, b.k_chunk, b.diagonal) for b in th.ring_schedule(n, zigzag) if b.rank == r
            ]
        elements = [o["elements"] for o in out]
        if zigzag:
            assert th.imbalance(elements) <= 0.10
        else:
            assert th.imbalance(elements) > 0.10


def test_cli_runs_cp(capsys):
    code = main(["run", "cp", "--world-size", "2", "--variant", "ring", "--zigzag", "--steps", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["strategy"] == "cp" and report["setup"]["zigzag"] is True
    assert report["parity"]["within_bounds"] is True
    assert report["comm"]["measured"] == report["comm"]["predicted"]
    assert report["memory"]["measured"]["activations"] == report["memory"]["predicted"]["activations"]
    assert report["work"]["measured"] == report["work"]["predicted"] == [5, 5]


def test_cli_refuses_ulysses_that_does_not_split_heads(capsys):
    code = main(["run", "cp", "--world-size", "4", "--variant", "ulysses"])
    assert code == 2 and "must divide n_heads=4 and n_kv_heads=2" in capsys.readouterr().err


# ---- figures and the dashboard -------------------------------------------------------------------
def _cells_by_trace(fig):
    return {t.name: sum(v is not None for row in t.z for v in row) for t in fig.data if t.type == "heatmap"}


def test_score_matrix_colours_every_computed_block_by_its_rank():
    from playbook.viz.cp import score_matrix

    fig = score_matrix(4, zigzag=False, step=3)  # the last step: every block already computed
    cells = _cells_by_trace(fig)
    assert [cells[f"rank {r}, earlier"] + cells.get(f"rank {r}, now", 0) for r in range(4)] == [1, 2, 3, 4]
    assert "rank 0, now" not in cells  # at the last step rank 0 is idle: its block is masked and skipped
    at_step_1 = _cells_by_trace(score_matrix(4, zigzag=True, step=1))
    assert sum(v for k, v in at_step_1.items() if k.endswith("now")) == 8  # 2 blocks per rank off the diagonal
    assert sum(v for k, v in at_step_1.items() if k.endswith("later")) == 16
    ulysses = _cells_by_trace(score_matrix(2, variant="ulysses"))  # every rank computes all 4 blocks (its heads)
    assert ulysses == {"every rank (heads/n each)": 3, "every rank (heads/n each), masked, computed anyway": 1}


def test_scaling_figure_leaves_out_what_a_variant_cannot_do():
    from playbook.viz.cp import cp_scaling

    fig = cp_scaling(ModelConfig.preset("llama-3.1-8b"), seq_len=4096, ns=(1, 2, 4, 8, 16))
    memory = {t.name: list(t.x) for t in fig.data if t.xaxis == "x"}
    assert memory["ring"] == [1, 2, 4, 8, 16] and memory["ulysses"] == [1, 2, 4, 8]  # 8 kv heads


def test_dashboard_step_slider_changes_the_figure_and_errors_are_shown():
    from playbook.viz.cp_dashboard import cp_dashboard

    box = cp_dashboard(model="llama-3.1-8b", seq_len=4096, n=4, zigzag=True)
    before = _cells_by_trace(box.figure)
    box.controls["step"].value = 2
    assert _cells_by_trace(box.figure) != before
    assert "Blocks per rank</b>: [9, 9, 9, 9]" in box.message.value
    box.controls["variant"].value = "ulysses"
    box.controls["n"].value = 8
    box.controls["model"].value = "gpt-tiny"  # 2 kv heads: Ulysses cannot go to 8
    assert "must divide n_heads=4 and n_kv_heads=2" in box.message.value


def test_chapter5_overlap_thresholds_full_block_and_zigzag():
    # chapter 5: g·B·peak / (2·a·bandwidth) = 8·2·989.4e12 / (64·bw); zig-zag does half the compute per step
    from playbook.hardware import Hardware

    h100 = Hardware.preset("h100-sxm")
    cfg = ModelConfig.preset("llama-3.1-8b")

    def tokens(bw, zigzag):
        o = th.overlap(
            cfg, seq_len=131072, micro_batch=1, cp=32, peak_flops=h100.peak_bf16_flops, bandwidth=bw, zigzag=zigzag
        )
        return o.min_shard_tokens

    nvlink, network = h100.intra_node_bandwidth, h100.inter_node_bandwidth
    assert [round(tokens(nvlink, z), -1) for z in (False, True)] == [550, 1100]
    assert [round(tokens(network, z), -2) for z in (False, True)] == [4900, 9900]
    # the step itself: zig-zag computes half as long for the same bytes
    full, zz = (
        th.overlap(cfg, seq_len=131072, micro_batch=1, cp=32, peak_flops=1e15, bandwidth=nvlink, zigzag=z)
        for z in (False, True)
    )
    assert (
        zz.compute_seconds == pytest.approx(full.compute_seconds / 2) and zz.transfer_seconds == full.transfer_seconds
    )
