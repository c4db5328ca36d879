"""Tensor and sequence parallelism: every collective's gradient against a single process, parity of
the whole model (ours and DTensor) at t = 2 and 4, collectives and memory measured == predicted.

Expected values are derived by hand in the tests (b, s, h ... written out), never copied from output.
gpt-tiny (4 heads, 2 KV heads) runs at t = 2; t = 4 needs 4 KV heads, so gpt-small runs there.
"""

from __future__ import annotations

import json

import pytest
import torch

from playbook.cli import main
from playbook.config import ModelConfig
from playbook.model.gpt import GPT
from playbook.parallel.report import compare
from playbook.parallel.comm import (
    CopyToModelParallelRegion,
    GatherFromSequenceParallelRegion,
    ReduceFromModelParallelRegion,
    ReduceScatterToSequenceParallelRegion,
)
from playbook.parallel.tp.model import TPGPT, unshard
from playbook.parallel.tp.layers import VocabParallelCrossEntropy
from playbook.measure.matmul import matmul_throughput
from playbook.parallel.tp.run import gather_result, on_rank, run_tp, train_loop
from playbook.parallel.training import TrainSetup, train
from playbook.parallel.parity import assert_parity as check
from playbook.theory.inventory.activations import block_activation_bytes
from playbook.theory.tp.layout import check_tp, matrix_shards, params_per_rank, valid_tp
from playbook.theory.tp.comm import layer_comm, step_collectives, summarize
from playbook.theory.tp.tp import tp_block_activation_breakdown, tp_model_activation_bytes, tp_training_memory


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The single-process references run here: one thread, like each rank (measured: several
    threads on a shared 2-core machine ran 10-30x slower)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


TINY, SMALL = ModelConfig.preset("gpt-tiny"), ModelConfig.preset("gpt-small")
SETUPS = {2: TrainSetup(model="gpt-tiny", steps=3), 4: TrainSetup(model="gpt-small", steps=3)}
CASES = [(2, False), (2, True), (4, False), (4, True)]  # (t, sequence parallel)
# ours: (t, sequence parallel, regather (Megatron's SP memory saving), recompute)
OURS = [(t, sp, False, "none") for t, sp in CASES] + [
    (2, True, True, "none"),
    (4, True, True, "none"),
    (2, False, False, "selective"),
    (2, False, False, "full"),
    (2, True, True, "full"),
    (4, True, False, "full"),
]


# ---- the conjugate operators against one process ------------------------------------------------
def _collective_grads(ctx):
    """Each operator on this rank's piece of a tensor every rank can build, with an upstream gradient
    that is rank-dependent and non-contiguous (through a transpose): the trap of torch's autograd all-gather on gloo (chapter 9)."""
    t, r, group = ctx.world_size, ctx.rank, ctx.group
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(2, 4 * t, 3, generator=gen)  # [b, s, h], the same on every rank
    weights = [torch.randn(2, 4 * t, 3, generator=gen) for _ in range(t)]  # rank i's upstream weight
    out = {}

    x = full.clone().requires_grad_()
    y = CopyToModelParallelRegion.apply(x, group, "test")  # f
    (y.transpose(1, 2) * weights[r].transpose(1, 2)).sum().backward()
    out["f"] = (y.detach(), x.grad)

    x = (full * (r + 1)).requires_grad_()  # rank r holds (r+1)·full: the sum is known
    y = ReduceFromModelParallelRegion.apply(x, group, "test")  # g
    (y.transpose(1, 2) * weights[r].transpose(1, 2)).sum().backward()
    out["g"] = (y.detach(), x.grad)

    x = full.chunk(t, 1)[r].clone().requires_grad_()  # [b, s/t, h]
    y = GatherFromSequenceParallelRegion.apply(x, group, "test")  # [b, s, h]
    (y.transpose(1, 2) * weights[r].transpose(1, 2)).sum().backward()
    out["gather"] = (y.detach(), x.grad)

    x = (full * (r + 1)).requires_grad_()
    y = ReduceScatterToSequenceParallelRegion.apply(x, group, "test")  # [b, s/t, h]
    (y.transpose(1, 2) * weights[r].chunk(t, 1)[r].transpose(1, 2)).sum().backward()
    out["reduce_scatter"] = (y.detach(), x.grad)
    return full, weights, out


@pytest.mark.parametrize("t", [2, 4])
def test_conjugate_operators_match_one_process(t, request):
    ranks = request.getfixturevalue(f"ranks{t}")
    answers = ranks.run(_collective_grads, progress=False)
    full, weights, _ = answers[0]
    total = sum(weights)  # Σ_r w_r
    coef = t * (t + 1) / 2  # Σ_r (r+1)
    for r, (_, _, out) in enumerate(answers):
        y, gx = out["f"]  # identity forward; backward sums every rank's gradient
        torch.testing.assert_close(y, full)
        torch.testing.assert_close(gx, total)
        y, gx = out["g"]  # forward sums; backward passes the gradient through
        torch.testing.assert_close(y, coef * full)
        torch.testing.assert_close(gx, weights[r])
        y, gx = out["gather"]  # forward gathers the sequence; backward sums, keeps this rank's shard
        torch.testing.assert_close(y, full)
        torch.testing.assert_close(gx, total.chunk(t, 1)[r])
        y, gx = out["reduce_scatter"]  # forward sums, keeps shard r; backward gathers every shard's gradient
        torch.testing.assert_close(y, (coef * full).chunk(t, 1)[r])
        torch.testing.assert_close(gx, torch.cat([w.chunk(t, 1)[i] for i, w in enumerate(weights)], 1))


def _vocab_parallel_loss_on_large_logits(ctx, shift):
    """The loss and this rank's logit gradient, from the rank's vocabulary slice of logits + shift."""
    gen = torch.Generator().manual_seed(1)
    V = 8 * ctx.world_size
    full = torch.randn(3, 5, V, generator=gen) * 4 + shift  # [b, s, V], the same on every rank
    targets = torch.randint(0, V, (3, 5), generator=gen)  # every rank's slice holds some targets
    n = V // ctx.world_size
    piece = full[..., ctx.rank * n : (ctx.rank + 1) * n].clone().requires_grad_()
    loss = VocabParallelCrossEntropy.apply(piece, targets, ctx.rank * n, ctx.group)
    loss.backward()
    return full, targets, loss.detach(), piece.grad


def test_vocab_parallel_cross_entropy_on_shifted_logits(ranks2):
    """Logits around 200 (fp32): exp(200) overflows, so the loss must subtract the global max, an
    all-reduce with MAX. Summing the ranks' maxes instead (about 400) makes every exp(z - m) underflow
    to 0 and the loss infinite, though the formula is shift-invariant on paper."""
    answers = ranks2.run(_vocab_parallel_loss_on_large_logits, 200.0, progress=False)
    full, targets, _, _ = answers[0]
    x = full.clone().requires_grad_()
    want = torch.nn.functional.cross_entropy(x.flatten(0, 1), targets.flatten())
    want.backward()
    n = full.shape[-1] // 2
    for r, (_, _, loss, grad) in enumerate(answers):
        torch.testing.assert_close(loss, want.detach())
        torch.testing.assert_close(grad, x.grad[..., r * n : (r + 1) * n])


# ---- outputs ------------------------------------------------------------------------------------
def _logits(ctx, model_name, sequence_parallel):
    cfg = ModelConfig.preset(model_name)
    tokens, _ = TrainSetup(model=model_name).task().batch(5, 4, 16)
    with torch.no_grad():
        return TPGPT(GPT(cfg, seed=3), ctx.group, sequence_parallel=sequence_parallel)(tokens)  # [b, s, V/t]


@pytest.mark.parametrize("t,sp", CASES)
def test_forward_logits_equal_the_reference(t, sp, request):
    name = SETUPS[t].model
    shards = request.getfixturevalue(f"ranks{t}").run(_logits, name, sp, progress=False)
    got = torch.cat(shards, dim=-1)  # the vocabulary shards side by side: [b, s, V]
    tokens, _ = TrainSetup(model=name).task().batch(5, 4, 16)
    with torch.no_grad():
        want = GPT(ModelConfig.preset(name), seed=3)(tokens)
    assert shards[0].shape[-1] == ModelConfig.preset(name).vocab_size // t
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


TIED = ModelConfig(
    vocab_size=48, hidden=32, n_layers=2, n_heads=4, ffn_hidden=64, max_seq_len=16, tie_embeddings=True
)  # plain multi-head attention, embedding tied to the head


def _one_step_grads(ctx, cfg, sp, regather):
    from playbook.parallel.grads import shard_dims

    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(cfg.vocab_size, (4, 16), generator=gen)
    targets = torch.randint(cfg.vocab_size, (4, 16), generator=gen)
    model = TPGPT(GPT(cfg, seed=2), ctx.group, sequence_parallel=sp, regather=regather)
    _, loss = model(tokens, targets)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}, shard_dims(model)


@pytest.mark.parametrize("sp,regather", [(False, False), (True, True)])
def test_tied_embeddings_and_multi_head_attention(sp, regather, ranks2):
    """A tied embedding is split by vocabulary rows for both uses; every gradient still matches."""
    from playbook.parallel.report import max_rel_diff

    answers = ranks2.run(_one_step_grads, TIED, sp, regather, progress=False)
    dims = answers[0][2]
    grads = unshard([a[1] for a in answers], dims)
    if sp:  # each rank's norm weights saw half the tokens: the sum is the full gradient
        grads |= {n: answers[0][1][n] + answers[1][1][n] for n, d in dims.items() if d is None}
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(TIED.vocab_size, (4, 16), generator=gen)
    targets = torch.randint(TIED.vocab_size, (4, 16), generator=gen)
    ref = GPT(TIED, seed=2)
    _, loss = ref(tokens, targets)
    loss.backward()
    assert "lm_head.weight" not in dims  # one tensor, named once, as in the reference
    assert abs(answers[0][0] - loss.item()) < 1e-5
    assert max_rel_diff(grads, {n: p.grad for n, p in ref.named_parameters()}) < 1e-5


# ---- training parity, comm and memory (one run per case, shared by the tests below) -------------
_RUNS: dict = {}
_REFERENCES: dict = {}


def run_case(request, t, sp, regather=False, recompute="none"):
    """Ours (and DTensor, in the plain cases) trained on t real ranks, once per case for all tests."""
    key = (t, sp, regather, recompute)
    if key not in _RUNS:
        native = not regather and recompute == "none"
        ranks = request.getfixturevalue(f"ranks{t}")
        _RUNS[key] = ranks.run(
            on_rank,
            SETUPS[t],
            sequence_parallel=sp,
            native=native,
            regather=regather,
            recompute=recompute,
            progress=False,
        )
    if t not in _REFERENCES:
        _REFERENCES[t] = train(SETUPS[t])
    return _RUNS[key], _REFERENCES[t]


def assert_parity(result, reference, t):
    """Loss, every gradient, and parameters after 3 AdamW steps as relative L2 per tensor, each within
    max(1e-5, 3x the float floor) (``parallel.parity``): Adam divides each gradient by its own
    magnitude, so elements whose gradient is ~1e-8 (at Adam's eps) turn a last-bit difference into a
    step of ~lr (the worst element, information only). gpt-tiny (t = 2) sits below 1e-5; on
    gpt-small (t = 4) float32 itself is ~1.4e-5 from float64 (mostly mlp.down_proj, whose small
    residual init makes those ~lr steps a larger share of the tensor). A missing, doubled or
    mis-sharded update moves every element of a tensor by ~lr, a relative L2 of ~1e-2."""
    check(compare(result, reference), SETUPS[t], f"t={t}")
    assert len(result.losses) == len(reference.losses) == 3


@pytest.mark.parametrize("t,sp,regather,recompute", OURS)
def test_ours_matches_single_process(t, sp, regather, recompute, request):
    answers, reference = run_case(request, t, sp, regather, recompute)
    assert_parity(gather_result([a[0] for a in answers]), reference, t)


@pytest.mark.parametrize("t,sp", CASES)
def test_dtensor_matches_single_process(t, sp, request):
    answers, reference = run_case(request, t, sp)
    assert_parity(answers[0][1], reference, t)


def _sp_without_grad_sync(ctx, setup):
    from playbook.parallel.grads import shard_dims

    model = TPGPT(GPT(setup.config(), seed=setup.seed), ctx.group, sequence_parallel=True)
    result = train_loop(model, setup, ctx.device)  # forgets to sum the norm weights' gradients
    return result, shard_dims(model)


def test_parity_check_catches_a_missing_gradient_sum(ranks2):
    """The tolerance is tight enough to fail: SP without the norm-gradient all-reduce."""
    answers = ranks2.run(_sp_without_grad_sync, SETUPS[2], progress=False)
    results = [a[0] for a in answers]
    grads = unshard([r.grads for r in results], answers[0][1])
    reference = train(SETUPS[2])
    err = max(
        float((grads[n] - reference.grads[n]).abs().max() / reference.grads[n].abs().max())
        for n in reference.grads
        if "norm" in n
    )
    assert err > 0.01


@pytest.mark.parametrize("t,sp,regather,recompute", OURS)
def test_collectives_measured_equal_predicted(t, sp, regather, recompute, request):
    answers, _ = run_case(request, t, sp, regather, recompute)
    cfg, setup = SETUPS[t].config(), SETUPS[t]
    sizes = dict(
        seq_len=setup.seq_len,
        micro_batch=setup.global_batch,
        tp=t,
        sequence_parallel=sp,
        regather=regather,
        recompute=recompute,
    )
    predicted = [vars(c) for c in step_collectives(cfg, **sizes)]
    for ours, _ in answers:  # every rank
        assert ours[2] == predicted  # same order, region, phase, op, bytes and bytes sent


@pytest.mark.parametrize("t,sp,regather", [case[:3] for case in OURS if case[3] == "none"])
def test_per_layer_counts_and_bytes_by_hand(t, sp, regather, request):
    answers, _ = run_case(request, t, sp, regather)
    setup = SETUPS[t]
    b, s, h = setup.global_batch, setup.seq_len, setup.config().hidden
    act = 4 * b * s * h  # one fp32 [b, s, h] activation
    per_layer = summarize([c for c in answers[0][0][2] if c["region"] in ("layer0.attn", "layer0.mlp")])
    if sp:  # an all-gather where each region starts, a reduce-scatter where it ends; reversed backward
        want = {
            ("forward", "all_gather"): 2,
            ("forward", "reduce_scatter"): 2,
            ("backward", "all_gather"): 4 if regather else 2,
            ("backward", "reduce_scatter"): 2,
        }
        sent = act * (t - 1) / t  # each sends S(t−1)/t
    else:  # Megatron: g twice forward, f twice backward
        want = {("forward", "all_reduce"): 2, ("backward", "all_reduce"): 2}
        sent = 2 * act * (t - 1) / t  # an all-reduce sends 2S(t−1)/t
    assert {k: v["count"] for k, v in per_layer.items()} == want
    for v in per_layer.values():
        assert v["bytes"] == v["count"] * act and v["sent_bytes"] == v["count"] * sent
    # either way 4·B·bsh(t−1)/t per direction: 8bsh(t−1)/t in 16-bit (regather: +2 all-gathers backward)
    for phase, extra in (("forward", 0), ("backward", 2 * act * (t - 1) / t if regather else 0)):
        assert sum(v["sent_bytes"] for k, v in per_layer.items() if k[0] == phase) == 4 * act * (t - 1) / t + extra


@pytest.mark.parametrize("t,sp,regather,recompute", OURS)
def test_memory_per_rank_measured_equals_predicted(t, sp, regather, recompute, request):
    answers, _ = run_case(request, t, sp, regather, recompute)
    setup = SETUPS[t]
    cfg = setup.config()
    predicted = tp_training_memory(
        cfg,
        seq_len=setup.seq_len,
        micro_batch=setup.global_batch,
        tp=t,
        sequence_parallel=sp,
        regather=regather,
        recompute=recompute,
        n_tensors=cfg.num_param_tensors(),
    )
    for a in answers:
        m = a[0][0].memory
        assert (m["params"], m["grads"], m["optimizer"], m["activations"]) == (
            predicted.params,
            predicted.grads,
            predicted.optimizer,
            predicted.activations,
        )
    # weights by hand: everything but the 2L+1 norms split t ways
    norms = (2 * cfg.n_layers + 1) * cfg.hidden
    assert answers[0][0][0].memory["params"] == 4 * ((cfg.num_params() - norms) // t + norms)


# ---- predictions by hand --------------------------------------------------------------------------
def test_params_per_rank_by_hand():
    # gpt-tiny: V=64, h=64, L=2, a=4, g=2, d=16, f=176. Split: embedding + head 2·64·64, per layer
    # q 64·64, k and v 2·32·64, o 64·64, MLP 3·64·176. Replicated: 2 norms per layer + final = 5·64.
    split = 2 * 64 * 64 + 2 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 176)
    assert params_per_rank(TINY, 2) == {"split": split // 2, "replicated": 5 * 64}
    assert params_per_rank(TINY, 1)["split"] + 5 * 64 == TINY.num_params()


@pytest.mark.parametrize("sp", [False, True])
def test_block_activations_closed_form(sp):
    # gpt-small at t=4: b=2, s=32, h=128, a=8 -> 2 heads/rank, d=16, f=352 -> 88/rank, B=4
    b, s, h, at, d, ft, B, t = 2, 32, 128, 2, 16, 88, 4, 4
    region = B * (4 * b * at * s * d + b * at * s * s + 4 * b * s * ft) + s * s  # heads and ffn: /t
    if sp:  # norms on s/t, the two all-gathered region inputs whole
        outside = B * (4 * b * (s // t) * h + 2 * b * (s // t) + 2 * b * s * h)
    else:
        outside = B * (6 * b * s * h + 2 * b * s)
    got = tp_block_activation_breakdown(SMALL, seq_len=s, micro_batch=b, tp=t, sequence_parallel=sp)
    assert sum(got.values()) == region + outside


@pytest.mark.parametrize("t", [2, 4])
def test_regather_divides_every_block_term_but_the_mask(t):
    """Like Korthikanti's TP+SP row sbh(34/t + 5as/(ht)): with the region inputs saved as sequence
    shards, our whole block is divided by t, except the [s, s] causal mask every rank builds."""
    sizes = dict(seq_len=32, micro_batch=2, dtype_bytes=2)
    one = sum(tp_block_activation_breakdown(SMALL, **sizes, tp=1).values())
    assert one == block_activation_bytes(SMALL, **sizes)  # t=1 is chapter 0's exact count
    got = sum(tp_block_activation_breakdown(SMALL, **sizes, tp=t, sequence_parallel=True, regather=True).values())
    mask = 32 * 32
    assert got == (one - mask) // t + mask


def test_full_recompute_repeats_the_forward_collectives_backward_needs():
    # t=2, TP: in backward each block reruns its attention's all-reduce (the MLP's input depends on
    # it) but not the MLP's own, whose output no saved tensor needs: 1 extra all-reduce per layer.
    c = layer_comm(TINY, seq_len=32, micro_batch=8, tp=2, recompute="full")
    assert c["recompute"] == {"all_reduce": 1, "sent_bytes": 2 * 4 * 8 * 32 * 64 / 2}
    sp = layer_comm(TINY, seq_len=32, micro_batch=8, tp=2, sequence_parallel=True, recompute="full")
    assert {k: v for k, v in sp["recompute"].items() if k != "sent_bytes"} == {"all_gather": 2, "reduce_scatter": 1}


def test_whole_model_activations_and_the_vocab_parallel_loss():
    # gpt-tiny, t=2, b=4, s=16: the loss keeps a softmax over V/t = 32 columns, not the [b, s, V] log-probs
    b, s, h, V, B = 4, 16, 64, 64, 4
    block = sum(tp_block_activation_breakdown(TINY, seq_len=s, micro_batch=b, tp=2).values())
    want = b * s * 9 + 2 * block + B * (2 * b * s * h + b * s) + B * b * s * h + B * b * s * V // 2 + 8 * b * s
    assert tp_model_activation_bytes(TINY, seq_len=s, micro_batch=b, tp=2) == want
    # in bf16 everything halves but the loss's softmax, which is kept in fp32
    B = 2
    block = sum(tp_block_activation_breakdown(TINY, seq_len=s, micro_batch=b, tp=2, dtype_bytes=2).values())
    want = b * s * 9 + 2 * block + B * (2 * b * s * h + b * s) + B * b * s * h + 4 * b * s * V // 2 + 8 * b * s
    assert tp_model_activation_bytes(TINY, seq_len=s, micro_batch=b, tp=2, dtype_bytes=2) == want


def test_layer_comm_is_8bsh_in_16_bit():
    b, s, h = 1, 2048, 12288  # the GPT-3-like layer of Korthikanti et al.
    gpt3 = ModelConfig(vocab_size=51200, hidden=h, n_layers=96, n_heads=96, ffn_hidden=4 * h, max_seq_len=2048)
    for t in (2, 4, 8):
        for sp in (False, True):
            c = layer_comm(gpt3, seq_len=s, micro_batch=b, tp=t, sequence_parallel=sp, dtype_bytes=2)
            assert c["forward"]["sent_bytes"] == c["backward"]["sent_bytes"] == 8 * b * s * h * (t - 1) / t
        # Narayanan et al.'s 8bsh(t−1)/t counts elements over both directions: the same number only in
        # 16-bit; in fp32 the bytes per direction are twice it, the elements (bytes / 4, both ways) equal it
        c = layer_comm(gpt3, seq_len=s, micro_batch=b, tp=t, dtype_bytes=4)
        assert c["forward"]["sent_bytes"] == 16 * b * s * h * (t - 1) / t
        assert (c["forward"]["sent_bytes"] + c["backward"]["sent_bytes"]) / 4 == 8 * b * s * h * (t - 1) / t


def test_matrix_shards_cover_each_matrix():
    for m in matrix_shards(TINY, 2):
        rows, cols = m["shape"]
        split = {"rows": (rows // 2, cols), "cols": (rows, cols // 2), None: (rows, cols)}[m["split"]]
        assert m["local"] == split


# ---- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg,t,message",
    [
        (TINY, 3, "tp=3 does not divide n_heads=4; try tp in {1, 2}"),
        (TINY, 4, "tp=4 does not divide n_kv_heads=2; try tp in {1, 2}"),
        (SMALL.replace(ffn_hidden=350), 4, "tp=4 does not divide ffn_hidden=350; try tp in {1, 2}"),
        (SMALL.replace(vocab_size=100), 8, "tp=8 does not divide n_kv_heads=4; try tp in {1, 2, 4}"),
        (SMALL.replace(vocab_size=102), 4, "tp=4 does not divide vocab_size=102; try tp in {1, 2}"),
    ],
)
def test_bad_degrees_name_the_constraint(cfg, t, message):
    with pytest.raises(ValueError) as err:
        check_tp(cfg, t)
    assert str(err.value) == message


def test_sequence_parallel_needs_a_divisible_sequence():
    with pytest.raises(ValueError, match="tp=2 does not divide seq_len=31"):
        check_tp(TINY, 2, seq_len=31, sequence_parallel=True)
    with pytest.raises(ValueError, match="regather saves sequence shards, so it needs sequence_parallel=True"):
        check_tp(TINY, 2, regather=True)
    assert valid_tp(SMALL) == [1, 2, 4]


def test_run_tp_refuses_before_starting_ranks():
    with pytest.raises(ValueError, match="tp=4 does not divide n_kv_heads=2"):
        run_tp(TrainSetup(model="gpt-tiny"), world_size=4, backend="gloo")


# ---- CLI and the throughput probe ---------------------------------------------------------------
def test_cli_run_tp_sequence_parallel_json(capsys):
    code = main(["run", "tp", "--world-size", "2", "--sequence-parallel", "--steps", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["strategy"] == "tp+sp" and report["world_size"] == 2
    assert report["parity"]["within_bounds"] is True
    assert report["native"]["max_rel_grad_diff"] <= report["parity"]["bounds"]["max_rel_grad_diff"]
    assert report["memory"]["predicted"]["activations"] == report["memory"]["measured"]["activations"]
    assert report["comm"]["predicted"] == report["comm"]["measured"]
    assert set(report["comm"]["measured"]) == {"all_gather", "reduce_scatter", "all_reduce"}


def test_matmul_throughput_shapes():
    rows = matmul_throughput(32, 64, 256, (1, 2, 4), repeats=2)
    assert [r["shape"] for r in rows] == [(32, 64, 256), (32, 64, 128), (32, 64, 64)]
    assert all(r["seconds"] > 0 and r["flops_per_s"] > 0 for r in rows)


# ---- figures and the dashboard ----------------------------------------------------------------------
def test_shard_diagram_one_trace_per_rank_and_the_replicated_norms():
    from playbook.viz.tp import shard_diagram

    fig = shard_diagram(SMALL, 4)
    assert [tr.name for tr in fig.data] == ["rank 0", "rank 1", "rank 2", "rank 3", "replicated (every rank)"]
    # 9 split matrices, each one rectangle (5 points + a gap) per rank
    assert all(len(tr.x) == 9 * 6 for tr in fig.data[:4])
    assert "rank 2: o_proj columns 64–95" in fig.data[2].text[4 * 6]  # o_proj [128 × 128], the 5th matrix


def test_dashboard_follows_its_controls():
    from playbook.viz.tp_dashboard import tp_dashboard

    d = tp_dashboard(model="gpt-small", tp=4, sequence_parallel=False, seq_len=128)
    bars = lambda: d.figures["memory"].data[-1].y  # noqa: E731  activations per valid t
    plain = bars()
    d.controls["sequence_parallel"].value = True
    assert all(a < b for a, b in zip(bars()[1:], plain[1:])) and bars()[0] == plain[0]  # t=1 unchanged
    assert "all-gather ×2, reduce-scatter ×2" in d.message.value
    d.controls["model"].value = "gpt-tiny"  # only t in {1, 2} split gpt-tiny
    assert list(d.controls["tp"].options) == [1, 2] and d.controls["tp"].value == 2
    assert len(d.figures["shards"].data) == 3


# ---- chapter 3's quoted shares -------------------------------------------------------------------
def test_chapter3_communication_share_of_a_layer():
    # the chapter's cell: H100 profile, compute at half the bf16 peak, no overlap
    from playbook.hardware import Hardware
    from playbook.theory.tp.comm import layer_seconds

    h100 = Hardware.preset("h100-sxm")

    def share(name, seq, t):
        r = layer_seconds(
            ModelConfig.preset(name),
            seq_len=seq,
            micro_batch=1,
            tp=t,
            hardware=h100,
            flops_per_s=0.5 * h100.peak_bf16_flops,
        )
        return round(r["comm"] / r["total"], 2)

    assert [share("llama-3.1-70b", 4096, t) for t in (2, 4, 8)] == [0.03, 0.08, 0.19]
    assert share("llama-3.1-8b", 512, 8) == 0.67
