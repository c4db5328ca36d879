"""Quantized serving: INT8/FP8 weights with per-output-channel scales, an 8-bit paged KV cache with
per-block scales, bytes measured = predicted, accuracy against fp32 stated, and TP2 ranks equal to one
process running the same quantized model."""

import pytest
import torch

from playbook.cli import main
from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.parallel.training import TrainSetup
from playbook.serve.accuracy import agreement
from playbook.serve.batching import ContinuousBatcher, make_requests
from playbook.serve.kv_quant import make_cache
from playbook.serve.quant import QuantizedLinear, quantize_model, quantize_weight, weight_bytes
from playbook.serve.quant_ref import logit_tolerance, reference
from playbook.serve.ranks import serve_on_rank
from playbook.serve.run import run_serve
from playbook.theory.serving.serving import kv_block_bytes
from playbook.theory.serving.weights import served_weight_bytes

TINY = ModelConfig.preset("gpt-tiny")


def test_per_channel_weights_are_within_half_a_step_and_the_matmul_dequantizes():
    w = torch.randn(48, 32, generator=torch.Generator().manual_seed(0))
    w[3] *= 50  # an outlier row coarsens only its own scale
    q, s = quantize_weight(w, "int8")
    assert q.dtype == torch.int8 and s.shape == (48,)
    assert torch.allclose(s, w.abs().amax(1) / 127)
    assert ((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-6).all()
    q8, s8 = quantize_weight(w, "fp8")
    assert q8.dtype == torch.float8_e4m3fn
    assert ((q8.float() * s8[:, None] - w).abs() <= w.abs() / 16 + s8[:, None] * 2**-9).all()  # e4m3: 3 mantissa bits
    x = torch.randn(5, 32)
    assert torch.allclose(QuantizedLinear(q, s)(x), x @ (q.float() * s[:, None]).T, atol=1e-4)


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_quantized_weight_bytes_measured_equal_predicted_and_the_reference_is_untouched(fmt):
    model = GPT(TINY, seed=0).eval()
    before = model.blocks[0].attn.q_proj.weight.clone()
    q = quantize_model(model, fmt)
    assert torch.equal(model.blocks[0].attn.q_proj.weight, before)  # a copy was quantized
    assert sum(isinstance(m, QuantizedLinear) for m in q.modules()) == 7 * TINY.n_layers
    assert weight_bytes(q) == served_weight_bytes(TINY, quantize=fmt)
    assert weight_bytes(model) == served_weight_bytes(TINY)


@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16", "fp16", "int8", "fp8"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_kv_block_bytes_read_off_the_tensors_equal_the_prediction(kv_dtype, block_size):
    for prefix in (False, True):
        cache = make_cache(
            kv_dtype, prefix=prefix, n_layers=2, kv_heads=2, head_dim=16, n_blocks=3, block_size=block_size
        )
        assert cache.block_bytes == kv_block_bytes(TINY, dtype=kv_dtype, block_size=block_size)
        held = sum(t.numel() * t.element_size() for t in vars(cache).values() if isinstance(t, torch.Tensor))
        assert held == 3 * cache.block_bytes  # nothing else is stored: no hidden 16-bit copy


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_a_block_filled_token_by_token_reads_back_within_its_scale(fmt):
    g, d, bs = 2, 16, 4
    cache = make_cache(fmt, n_layers=1, kv_heads=g, head_dim=d, n_blocks=3, block_size=bs)
    cache.add(0)
    gen = torch.Generator().manual_seed(1)
    ks = [torch.randn(g, 1, d, generator=gen) * (1 + 3 * i) for i in range(7)]  # each token larger: scale grows
    for k in ks:
        cache.reserve(0, 1)
        cache.write(0, 0, k, -k)
        cache.advance(0, 1)
    k, v = cache.read(0, 0, 7)
    want = torch.cat(ks, 1)  # [g, 7, d]
    for b in range(2):  # each block's error is bounded by its own final scale (twice rounded: one step)
        step = cache.k_scale[0, cache.tables[0][b]][:, None, None]
        part = slice(b * bs, min(b * bs + bs, 7))
        tol = step if fmt == "int8" else want[:, part].abs() / 8 + step
        assert ((k[:, part] - want[:, part]).abs() <= tol + 1e-6).all()
        assert torch.equal(v[:, part], -k[:, part])
    assert torch.allclose(cache.k_scale[0, cache.tables[0][1]], want[:, 4:].abs().amax((1, 2)) / cache_qmax(fmt))


def cache_qmax(fmt):
    return 127.0 if fmt == "int8" else 448.0


def test_batcher_bytes_held_equal_the_prediction_and_accuracy_is_stated():
    model = GPT(TINY, seed=0).eval()
    reqs = make_requests(6, TINY.vocab_size, seed=0)
    run = ContinuousBatcher(model, n_blocks=12, block_size=4, kv_dtype="int8").run(reqs)
    assert all(s["kv_bytes"] == s["kv_predicted"] for s in run.steps)
    assert max(s["kv_bytes"] for s in run.steps) > 0
    same = agreement(model, model, reqs)
    assert same["max_abs_logit_err"] < 1e-5 and same["top1_agreement"] == 1 and same["requests_identical"] == 6
    a = agreement(model, quantize_model(model, "fp8"), reqs, kv_dtype="fp8")
    assert 0 < a["max_abs_logit_err"] < 0.1 and 0.5 < a["top1_agreement"] <= 1
    assert a["positions"] == sum(r.max_new for r in reqs)


def test_tp2_quantized_serving_equals_one_process_with_the_same_quantized_model(ranks2):
    reqs = make_requests(6, TINY.vocab_size, seed=2)
    options = dict(n_blocks=16, block_size=4, max_batch=4)
    for fmt in ("int8", "fp8"):
        answers = ranks2.run(
            serve_on_rank,
            cfg=TINY,
            seed=0,
            dims=ParallelDims(tp=2),
            requests=reqs,
            quantize=fmt,
            kv_dtype=fmt,
            **options,
        )
        want = reference(TINY, 0, reqs, assign=[0] * 6, dp=1, quantize=fmt, kv_dtype=fmt, **options)
        fp32 = reference(TINY, 0, reqs, assign=[0] * 6, dp=1, quantize=None, kv_dtype="fp32", **options)
        assert any(not torch.equal(want[i][1], fp32[i][1]) for i in want)  # quantization did change the logits
        for a in answers:
            assert a["tokens"] == {i: want[i][0] for i in want}
            assert max(float((a["logits"][i] - want[i][1]).abs().max()) for i in want) <= logit_tolerance(fmt)
            assert a["weight_bytes"] == served_weight_bytes(TINY, tp=2, quantize=fmt)
            assert a["block_bytes"] == kv_block_bytes(TINY, tp=2, dtype=fmt, block_size=4)
            assert all(s["kv_bytes"] == s["kv_predicted"] for s in a["steps"])


def test_run_serve_quantized_report_and_one_line_refusals(capsys):
    report = run_serve(TrainSetup(), tp=2, dp=1, requests=3, quantize="int8", kv_dtype="int8")
    assert report.problem() is None and report.parity["bytes_match"]
    assert logit_tolerance("fp32") == 1e-5 and report.parity["logit_tolerance"] == logit_tolerance("int8") <= 1e-3
    assert "bytes per rank predicted" in report.summary()
    for argv, message in (
        (["--pp", "2", "--kv-dtype", "int8"], "--kv-dtype int8 serves TP × DP layouts, not --pp/--ep"),
        (["--model", "gpt-tiny-moe", "--tp", "2", "--quantize", "fp8"], "--quantize fp8 covers dense models"),
    ):
        assert main(["run", "serve", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


def test_serve_bench_prices_the_quantized_bytes_and_checks_against_the_same_quantized_model(ranks2):
    from playbook.serve.serve_bench import serve_bench

    kw = dict(tp=2, dp=1, requests=6, rate=1.0, ranks=ranks2)
    plain = serve_bench(TINY, **kw)
    q = serve_bench(TINY, quantize="int8", kv_dtype="int8", **kw)
    assert q["tokens_identical"] and q["setup"]["predicted_dtypes"] == {"weights": "int8", "kv": "int8"}
    assert plain["setup"]["predicted_dtypes"] == {"weights": "bf16", "kv": "bf16"}
    # same schedule, llama-3.1-8b's decode reads about half the bytes: its predicted TPOT drops
    assert q["predicted"]["tpot"]["p50"] < 0.8 * plain["predicted"]["tpot"]["p50"]
