"""The memory calculator against numbers derived by hand from the papers' formulas.

Every expected value below is worked out in the comment next to it (or quoted from the paper),
never copied from the code's output. Units: bytes unless a name says GB (1e9) or GiB (2**30).
"""

from __future__ import annotations

import ast
import inspect
import time

import pytest

from playbook.config import ModelConfig
from playbook.theory.hybrid import memory
from playbook.theory.hybrid.memory import InferenceMemory, inference_memory, kv_cache_bytes_per_token, training_memory
from playbook.theory.inventory.model_state import TrainingMemory, bytes_to_gb, bytes_to_gib, model_state_bytes
from playbook.theory.inventory.korthikanti import activation_bytes_per_layer
from playbook.theory.inventory.model_state import DTYPE_BYTES

GB = 1e9


# ---- units -------------------------------------------------------------------------------------
def test_units():
    assert bytes_to_gb(3e9) == 3.0
    assert bytes_to_gib(3 * 2**30) == 3.0
    assert DTYPE_BYTES == {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


def test_module_does_not_import_torch():
    tree = ast.parse(inspect.getsource(memory))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "torch" not in imported


# ---- ZeRO model state --------------------------------------------------------------------------
# ZeRO paper (arXiv:1910.02054) Figure 1: Ψ = 7.5B parameters, Nd = 64 GPUs, K = 12.
PSI, ND = 7.5e9, 64


def test_zero_paper_figure_1():
    # the figure's rounded per-GPU totals, in GB
    published = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in published.items():
        total = model_state_bytes(PSI, dp=ND, zero=stage).total
        assert round(bytes_to_gb(total), 1) == gb


# By hand (GB), mixed: params 2Ψ = 15, grads 2Ψ = 15, optimizer 12Ψ = 90; /64 where sharded:
#   15/64 = 0.234375, 90/64 = 1.40625.
# fp32: params 4Ψ = 30, grads 4Ψ = 30, Adam 8Ψ = 60; 30/64 = 0.46875, 60/64 = 0.9375.
ZERO_TABLE = {
    ("mixed", 0): (15, 15, 90),  # 120
    ("mixed", 1): (15, 15, 1.40625),  # 31.40625
    ("mixed", 2): (15, 0.234375, 1.40625),  # 16.640625
    ("mixed", 3): (0.234375, 0.234375, 1.40625),  # 1.875
    ("fp32", 0): (30, 30, 60),  # 120: fp32 Adam is also 16 bytes per parameter
    ("fp32", 1): (30, 30, 0.9375),  # 60.9375
    ("fp32", 2): (30, 0.46875, 0.9375),  # 31.40625
    ("fp32", 3): (0.46875, 0.46875, 0.9375),  # 1.875
}


@pytest.mark.parametrize("precision,zero", sorted(ZERO_TABLE))
def test_zero_stages_by_category(precision, zero):
    p, g, o = ZERO_TABLE[(precision, zero)]
    got = model_state_bytes(PSI, dp=ND, zero=zero, precision=precision)
    assert isinstance(got, TrainingMemory)
    assert got.params == pytest.approx(p * GB, rel=1e-12)
    assert got.grads == pytest.approx(g * GB, rel=1e-12)
    assert got.optimizer == pytest.approx(o * GB, rel=1e-12)
    assert got.activations == 0
    assert got.total == pytest.approx((p + g + o) * GB, rel=1e-12)
    assert got.as_dict()["total"] == got.total


# fp32 gradient accumulation (Ultra-Scale Playbook, "BF16 w/ FP32 grad acc"): 4Ψ more with the grads,
# sharded like them. By hand (GB), Ψ = 7.5e9, Nd = 64: grads 2Ψ + 4Ψ = 15 + 30 = 45; 45/64 = 0.703125.
GRAD_ACC_TABLE = {
    0: (15, 45, 90),  # 150 = 20Ψ
    1: (15, 45, 1.40625),
    2: (15, 0.703125, 1.40625),
    3: (0.234375, 0.703125, 1.40625),
}


@pytest.mark.parametrize("zero", sorted(GRAD_ACC_TABLE))
def test_fp32_grad_accumulation_buffer(zero):
    p, g, o = GRAD_ACC_TABLE[zero]
    got = model_state_bytes(PSI, dp=ND, zero=zero, fp32_grad_accum=True)
    assert (got.params, got.grads, got.optimizer) == pytest.approx((p * GB, g * GB, o * GB), rel=1e-12)


def test_fp32_grad_accumulation_reaches_every_training_memory_path():
    tiny, moe = ModelConfig.preset("gpt-tiny"), ModelConfig.preset("gpt-tiny-moe")
    sizes = dict(seq_len=32, micro_batch=4)
    for cfg, degrees, held in [
        (tiny, dict(dp=2, zero=2), 100_672 / 2),  # 100,672 parameters, grads sharded over 2
        (tiny, dict(tp=2), (100_672 - 320) // 2 + 320),  # 5 norm weights of 64 stay whole
        (tiny, dict(cp=2), 100_672),
        (tiny, dict(pp=2), 2 * 64 + 4 * 64 * 64 - 64 * 64 + 3 * 64 * 176 + 64 * 64),  # stage 0: a layer + embedding
        (moe, dict(ep=2, dp=2), 131_904 - 2 * 4 * 3 * 64 * 64 // 2),  # dense part + half the experts
    ]:
        plain = training_memory(cfg, **sizes, **degrees)
        acc = training_memory(cfg, **sizes, **degrees, fp32_grad_accum=True)
        assert acc.grads - plain.grads == 4 * held, degrees
        assert (acc.params, acc.optimizer, acc.activations) == (plain.params, plain.optimizer, plain.activations)
    with pytest.raises(ValueError, match="fp32_grad_accum needs precision='mixed'"):
        training_memory(tiny, **sizes, precision="fp32", fp32_grad_accum=True)
    with pytest.raises(ValueError, match="fp32_grad_accum must be False, True"):
        model_state_bytes(PSI, fp32_grad_accum="yes")
    with pytest.raises(ValueError, match="fp32_grad_accum needs precision='mixed'"):
        model_state_bytes(PSI, precision="fp32", fp32_grad_accum="main_grad")


# Megatron-LM's main_grad replaces the 16-bit gradient: grads 4Ψ, sharded like them. By hand (GB),
# Ψ = 7.5e9, Nd = 64: 4Ψ = 30; 30/64 = 0.46875; 2 + 4 + 12 = 18Ψ = 135 GB unsharded.
MAIN_GRAD_TABLE = {0: (15, 30, 90), 1: (15, 30, 1.40625), 2: (15, 0.46875, 1.40625), 3: (0.234375, 0.46875, 1.40625)}


@pytest.mark.parametrize("zero", sorted(MAIN_GRAD_TABLE))
def test_megatron_main_grad_replaces_the_16_bit_gradient(zero):
    p, g, o = MAIN_GRAD_TABLE[zero]
    got = model_state_bytes(PSI, dp=ND, zero=zero, fp32_grad_accum="main_grad")
    assert (got.params, got.grads, got.optimizer) == pytest.approx((p * GB, g * GB, o * GB), rel=1e-12)
    both = model_state_bytes(PSI, dp=ND, zero=zero, fp32_grad_accum="both")
    assert both == model_state_bytes(PSI, dp=ND, zero=zero, fp32_grad_accum=True)  # True means "both"
    assert both.grads - got.grads == pytest.approx(2 * PSI / (ND if zero >= 2 else 1))  # the bf16 gradient


def test_zero_with_one_rank_shards_nothing():
    for zero in range(4):
        assert model_state_bytes(1000, dp=1, zero=zero).total == 16_000


def test_step_tensors_are_added_unsharded():
    # Ψ = 1000, 3 tensors, dp = 4, stage 3, mixed: optimizer 12·1000/4 = 3000, plus 3 × 4 bytes = 3012
    got = model_state_bytes(1000, dp=4, zero=3, n_tensors=3)
    assert got.optimizer == 3012
    assert got.params == 500 and got.grads == 500


def test_fp32_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))  # 8·16+16+16·4+4 = 212 params
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    params = list(model.parameters())
    measured_opt = sum(t.nbytes for st in opt.state.values() for t in st.values() if torch.is_tensor(t))
    predicted = model_state_bytes(212, precision="fp32", n_tensors=len(params))
    assert sum(p.numel() for p in params) == 212
    assert predicted.optimizer == measured_opt == 8 * 212 + 4 * 4  # m, v in fp32 + four fp32 step scalars
    assert predicted.params == sum(p.nbytes for p in params) == 4 * 212
    assert predicted.grads == sum(p.grad.nbytes for p in params) == 4 * 212


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(zero=4), "zero must be one of 0, 1, 2, 3; got 4"),
        (dict(zero="1"), "zero must be one of 0, 1, 2, 3; got '1'"),
        (dict(precision="bf16"), "precision must be one of 'mixed', 'fp32'; got 'bf16'"),
        (dict(dp=0), "dp must be a positive integer, got 0"),
        (dict(dp=2.5), "dp must be a positive integer, got 2.5"),
        (dict(n_tensors=-1), "n_tensors must be a non-negative integer"),
    ],
)
def test_model_state_refuses_bad_options(kwargs, message):
    with pytest.raises(ValueError) as err:
        model_state_bytes(1000, **kwargs)
    assert message in str(err.value)


@pytest.mark.parametrize("psi", [0, -5, float("nan"), "7B", True])
def test_model_state_refuses_bad_param_counts(psi):
    with pytest.raises(ValueError, match="num_params must be a positive number"):
        model_state_bytes(psi)


# ---- Korthikanti et al. 2022, Table 2 ----------------------------------------------------------
# GPT-3 175B-like layer as in the paper: s = 2048, b = 1, h = 12288, a = 96, t = 8.
#   sbh = 2048 · 12288 = 25,165,824;  5as/h = 5 · 96 · 2048 / 12288 = 80;  24/t = 3;  34/t = 4.25
GPT3 = dict(seq_len=2048, micro_batch=1, hidden=12288, heads=96)
KORTHIKANTI = [
    # (tp, sequence_parallel, recompute, bytes)
    (1, False, "none", 2_868_903_936),  # sbh(34 + 80) = 114 sbh
    (1, True, "none", 2_868_903_936),  # t = 1: sequence parallelism changes nothing
    (1, False, "selective", 855_638_016),  # 34 sbh
    (8, False, "none", 578_813_952),  # sbh(10 + 3 + 80/8) = 23 sbh
    (8, True, "none", 358_612_992),  # sbh(4.25 + 10) = 14.25 sbh
    (8, False, "selective", 327_155_712),  # sbh(10 + 3) = 13 sbh
    (8, True, "selective", 106_954_752),  # 4.25 sbh
    (8, False, "full", 50_331_648),  # 2 sbh
    (8, True, "full", 50_331_648),  # 2 sbh: the table has one row for full recomputation
    (1, False, "full", 50_331_648),  # 2 sbh
]


@pytest.mark.parametrize("tp,sp,recompute,expected", KORTHIKANTI)
def test_korthikanti_table_2(tp, sp, recompute, expected):
    got = activation_bytes_per_layer(**GPT3, tp=tp, sequence_parallel=sp, recompute=recompute)
    assert got == pytest.approx(expected, rel=1e-12)


def test_activation_scales_with_micro_batch():
    one = activation_bytes_per_layer(**{**GPT3, "micro_batch": 1})
    four = activation_bytes_per_layer(**{**GPT3, "micro_batch": 4})
    assert four == 4 * one


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(recompute="partial"), "recompute must be one of 'none', 'selective', 'full'; got 'partial'"),
        (dict(tp=5), "tp=5 does not divide heads=96; try tp in {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96}"),
        (dict(tp=0), "tp must be a positive integer, got 0"),
        (dict(seq_len=0), "seq_len must be a positive integer, got 0"),
        (dict(micro_batch=-1), "micro_batch must be a positive integer, got -1"),
        (dict(sequence_parallel="yes"), "sequence_parallel must be True or False"),
    ],
)
def test_activation_refuses_bad_inputs(kwargs, message):
    with pytest.raises(ValueError) as err:
        activation_bytes_per_layer(**{**GPT3, **kwargs})
    assert message in str(err.value)


# ---- training_memory ---------------------------------------------------------------------------
LLAMA_8B = ModelConfig.preset("llama-3.1-8b")


def test_training_memory_with_a_1f1b_pipeline():
    tiny = ModelConfig.preset("gpt-tiny")  # 2 layers, hidden 64, vocab 64, untied
    got = training_memory(tiny, seq_len=32, micro_batch=4, pp=2, precision="fp32")
    layer = 2 * 64 + (4 * 64 * 64 - 2 * 64 * 64 // 2) + 3 * 64 * 176  # norms, q/o + k/v at 2 of 4 heads, SwiGLU
    assert layer == tiny.layer_params()
    first, last = layer + 64 * 64, layer + 64 + 64 * 64  # embedding | final norm + head
    from playbook.theory.inventory.activations import model_activation_breakdown

    parts = model_activation_breakdown(tiny, seq_len=32, micro_batch=4, dtype_bytes=4)
    block = parts["blocks"] // 2
    stage0 = 2 * (block + parts["tokens (int64)"])  # stage 0 holds p = 2 micro-batches in flight
    stage1 = block + sum(v for k, v in parts.items() if k not in ("blocks", "tokens (int64)"))
    assert 16 * first + stage0 > 16 * last + stage1  # fp32 Adam: 16 bytes per parameter
    assert (got.params, got.activations) == (4 * first, stage0)  # stage 0 is the most loaded
    with pytest.raises(ValueError, match="pp=3 exceeds n_layers=2"):
        training_memory(tiny, seq_len=32, micro_batch=4, pp=3)


@pytest.mark.parametrize(
    "name, degrees",
    [
        ("llama-3.1-8b", dict(tp=8)),
        ("llama-3.1-8b", dict(cp=4)),
        ("llama-3.1-8b", dict(pp=4, dp=4, zero=1)),
        ("mixtral-8x7b", dict(ep=8, dp=8, zero=2)),
        ("deepseek-v3", dict(pp=4)),
        ("gpt-tiny", dict(tp=2, sequence_parallel=True)),
    ],
)
def test_the_every_degree_path_agrees_with_each_chapter_alone(name, degrees):
    """layout_stage_memory builds a stage from local shapes; with one degree > 1 it must give what
    each chapter's own exact function gives (independent code: theory.tp, cp, moe, stages)."""
    from playbook.theory.hybrid.stages import layout_stage_memory, most_loaded_stage

    cfg = ModelConfig.preset(name)
    for precision in ("mixed", "fp32"):
        want = training_memory(
            cfg, seq_len=32 if name == "gpt-tiny" else 4096, micro_batch=1, precision=precision, **degrees
        )
        stages = layout_stage_memory(
            cfg, seq_len=32 if name == "gpt-tiny" else 4096, micro_batch=1, precision=precision, **degrees
        )
        assert stages[most_loaded_stage(stages)].memory.as_dict() == pytest.approx(want.as_dict(), rel=1e-12)


@pytest.mark.parametrize("dims", [dict(tp=2, pp=2), dict(dp=2, tp=2, pp=2), dict(tp=2, cp=2), dict(dp=2, cp=2)])
def test_every_degree_together_equals_the_exact_hybrid_count_of_our_runs(dims):
    """theory.hybrid.memory_per_rank is held to the measured bytes on real ranks (tests/parallel/hybrid/test_hybrid.py);
    the general function must agree with it for our GPT in fp32 (AdamW's step counters aside)."""
    from playbook.dims import ParallelDims
    from playbook.theory.hybrid.hybrid import memory_per_rank
    from playbook.theory.hybrid.stages import layout_stage_memory

    tiny, d = ModelConfig.preset("gpt-tiny"), ParallelDims(**dims)
    rows = 8 // d.dp
    stages = layout_stage_memory(tiny, seq_len=32, micro_batch=rows // d.pp, precision="fp32", **dims)
    for stage in range(d.pp):
        exact = memory_per_rank(tiny, d, rank=d.rank(pp=stage), global_batch=8, seq_len=32, microbatches=d.pp)
        got = stages[stage].memory
        assert (got.params, got.grads, got.activations) == (exact["params"], exact["grads"], exact["activations"])


def test_published_layouts_fit_their_gpus():
    """Llama 3 405B as trained (Dubey et al. 2024, §3.3: TP8 × PP16 × DP at 8K; TP8 × CP16 × PP16 at 128K;
    with ZeRO-1-style sharding and recomputation) fits an 80 GB H100; DeepSeek-V3's PP16 × EP64 too."""
    llama = ModelConfig.preset("llama-3.1-405b")
    short = training_memory(llama, seq_len=8192, micro_batch=1, tp=8, pp=16, dp=64, zero=1, recompute="full")
    long = training_memory(llama, seq_len=131072, micro_batch=1, tp=8, cp=16, pp=16, dp=8, zero=1, recompute="full")
    ds = training_memory(
        ModelConfig.preset("deepseek-v3"), seq_len=4096, micro_batch=1, pp=16, ep=64, dp=128, zero=1, recompute="full"
    )
    # weights by hand: 405.85e9 / (8·16) parameters per rank plus the first stage's embedding slice
    per_rank = 405_853_388_800 / 128
    assert short.params >= 2 * per_rank and short.params < 2 * (per_rank + 128_256 * 16_384 / 8) * 1.05
    for m in (short, long, ds):
        assert m.total < 80e9


def test_training_memory_with_tensor_parallelism():
    tiny = ModelConfig.preset("gpt-tiny")  # 100,672 params; hidden 64, 2 layers
    got = training_memory(tiny, seq_len=32, micro_batch=8, tp=2, precision="fp32")
    # by hand: the 2L+1 = 5 RMSNorm weights (5·64 = 320) stay whole, the rest is halved
    held = (100_672 - 320) // 2 + 320
    assert (got.params, got.grads, got.optimizer) == (4 * held, 4 * held, 8 * held)
    from playbook.theory.tp.tp import tp_model_activation_bytes

    assert got.activations == tp_model_activation_bytes(tiny, seq_len=32, micro_batch=8, tp=2, dtype_bytes=4)
    with pytest.raises(ValueError, match="tp=3"):
        training_memory(tiny, seq_len=32, micro_batch=8, tp=3)


def test_training_memory_with_context_parallelism():
    tiny = ModelConfig.preset("gpt-tiny")
    alone = training_memory(tiny, seq_len=64, micro_batch=8, precision="fp32")
    got = training_memory(tiny, seq_len=64, micro_batch=8, cp=2, precision="fp32")
    assert (got.params, got.grads, got.optimizer) == (alone.params, alone.grads, alone.optimizer)  # replicated
    from playbook.theory.cp import cp_activation_bytes

    assert got.activations == cp_activation_bytes(tiny, seq_len=64, micro_batch=8, cp=2, dtype_bytes=4)
    assert got.activations < alone.activations / 2 + 1e5  # about half the sequence per rank


def test_training_memory_with_expert_parallelism():
    moe = ModelConfig.preset("gpt-tiny-moe")  # 131,904 params: 2 MoE layers of 4 experts, each 3·64·64
    got = training_memory(moe, seq_len=32, micro_batch=4, ep=2, dp=2, precision="fp32")
    routed = 2 * 4 * 3 * 64 * 64
    held = (131_904 - routed) + routed // 2  # dense part whole, half of the experts
    assert (got.params, got.grads, got.optimizer) == (4 * held, 4 * held, 8 * held)
    with pytest.raises(ValueError):
        training_memory(moe, seq_len=32, micro_batch=4, ep=3, dp=3)  # 3 does not divide 4 experts


# gpt-tiny-moe by hand, fp32 (B = 4), b·s = T tokens: h 64, 4 heads of 16 (2 kv), vocab 64, 2 layers,
# both MoE with E = 4 experts, k = 2, expert width 64. Attention and norms of one block (module
# docstring of theory/activations.py): 10·T·h + 2·T + b·a·s² elements, plus the s² bool mask.
# MoE MLP (theory/moe.moe_mlp_activation_terms, read from playbook/model/moe.py) at even routing,
# S = R = k·T: router probs T·E·B, top-k ids 8·k·T, f E·B, token ids and order 8·S each, gates S·B,
# three S·h·B copies, expert SwiGLU 4·R·64·B, top-k probs k·T·B and their sum T·B.
def _tiny_moe_block(b, s):
    T, S, B = b * s, 2 * b * s, 4
    attention = (10 * T * 64 + 2 * T + b * 4 * s * s) * B + s * s
    mlp = T * 4 * B + 8 * 2 * T + 4 * B + 2 * 8 * S + S * B + 3 * S * 64 * B + 4 * S * 64 * B + 2 * T * B + T * B
    return attention + mlp


def _tiny_ends(b, s):  # int64 tokens (first stage) | final norm, log-probs, int64 targets, total_weight (last)
    T = b * s
    return 8 * T, (3 * T * 64 + T) * 4 + T * 64 * 4 + 8 * T + 4


def test_training_memory_counts_moe_activations_exactly():
    moe = ModelConfig.preset("gpt-tiny-moe")
    # global batch 8 of 32 tokens on one rank: 2 blocks of 1,728,528 + 2,048 + 265,220 = 3,724,324
    assert _tiny_moe_block(8, 32) == 1_728_528
    first, last = _tiny_ends(8, 32)
    alone = training_memory(moe, seq_len=32, micro_batch=8, precision="fp32")
    assert alone.activations == 2 * _tiny_moe_block(8, 32) + first + last == 3_724_324
    # ep = 2 inside dp = 2: 4 sequences per rank; at even routing a rank's 2 experts still receive k·T rows
    first, last = _tiny_ends(4, 32)
    split = training_memory(moe, seq_len=32, micro_batch=4, ep=2, dp=2, precision="fp32")
    assert split.activations == 2 * _tiny_moe_block(4, 32) + first + last == 1_863_204
    # and it is the count theory.moe makes for our MoE layer given those even routing counts
    from playbook.theory.moe.moe import model_activation_bytes_moe

    even = [{"counts_by_rank": [[64] * 4, [64] * 4], "capacity": None, "tokens": 128}] * 2
    assert split.activations == model_activation_bytes_moe(moe, seq_len=32, micro_batch=4, layers=even, ep=2)


def test_pipeline_counts_moe_activations_as_at_pp_1():
    moe = ModelConfig.preset("gpt-tiny-moe")
    got = training_memory(moe, seq_len=32, micro_batch=8, pp=2, precision="fp32")
    first, last = _tiny_ends(8, 32)
    # stage 0: one MoE block and the tokens, 2 micro-batches in flight; stage 1 holds 64 more
    # parameters (final norm: 16·64 = 1 KiB) but only 1 micro-batch of ~2 MB: stage 0 is the busiest
    assert got.activations == 2 * (_tiny_moe_block(8, 32) + first) == 3_461_152
    # Mixtral at pp = 2: both stages hold MoE layers; one micro-batch through all stages = pp = 1
    from playbook.theory.hybrid.stages import pipeline_stage_memory

    mixtral = ModelConfig.preset("mixtral-8x7b")
    stages = pipeline_stage_memory(mixtral, pp=2, seq_len=4096, micro_batch=1)
    assert [st.n_moe_layers for st in stages] == [16, 16]
    one_pass = sum(st.memory.activations / st.in_flight for st in stages)
    assert one_pass == training_memory(mixtral, seq_len=4096, micro_batch=1).activations


def test_pipeline_stages_classify_dense_and_moe_layer_by_layer():
    from playbook.theory.hybrid.stages import most_loaded_stage, pipeline_stage_memory

    ds = ModelConfig.preset("deepseek-v3")  # 61 layers: 0..2 dense, 3..60 MoE (first_k_dense_replace 3)
    h = 7168
    # MLA attention (DeepSeek-V2 §2.1): q down 7168·1536 + norm 1536 + q up 1536·128·192;
    # kv down 7168·(512 + 64) + norm 512 + kv up 512·128·(128 + 128); output 128·128·7168
    attention = h * 1536 + 1536 + 1536 * 128 * 192 + h * 576 + 512 + 512 * 128 * 256 + 128 * 128 * h
    dense = 2 * h + attention + 3 * h * 18432
    moe = 2 * h + attention + h * 256 + (256 + 1) * 3 * h * 2048  # router, 256 routed + 1 shared expert
    table = 129280 * h
    stage0 = table + 3 * dense + 28 * moe  # layers 0..30 (61 = 31 + 30)
    stage1 = 30 * moe + h + table  # layers 31..60, final norm, head
    assert round(stage0 / 1e9, 1) == 324.9 and round(stage1 / 1e9, 1) == 346.1
    stages = pipeline_stage_memory(ds, pp=2, seq_len=8192, micro_batch=1)
    assert [(st.first_layer, st.n_layers, st.n_moe_layers) for st in stages] == [(0, 31, 28), (31, 30, 30)]
    assert [st.params for st in stages] == [stage0, stage1]
    assert (stages[0].embedding, stages[0].head, stages[1].embedding, stages[1].head) == (True, False, False, True)
    # Which stage is busiest at s = 8192? Stage 1 has 16·(stage1 − stage0) = 340 GB more model state;
    # stage 0 holds 2 micro-batches of 31 blocks against stage 1's 1 of 30, and every block keeps at
    # least its bf16 probabilities, 128·8192²·2 = 17.2 GB: (62 − 30)·17.2 = 550 GB > 340 GB + stage 1's
    # log-probabilities (8192·129280·2 = 2.1 GB) and final norm. So stage 0.
    assert 32 * 128 * 8192**2 * 2 > 16 * (stage1 - stage0) + 8192 * 129280 * 2 + 4 * 8192 * h * 2
    assert most_loaded_stage(stages) == 0
    assert training_memory(ds, seq_len=8192, micro_batch=1, pp=2) == stages[0].memory
    assert training_memory(ds, seq_len=8192, micro_batch=1, pp=2).params == 2 * stage0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(seq_len=0), "seq_len must be a positive integer, got 0"),
        (dict(micro_batch=0), "micro_batch must be a positive integer, got 0"),
        (dict(dp=-2), "dp must be a positive integer, got -2"),
        (dict(zero=5), "zero must be one of 0, 1, 2, 3; got 5"),
        (dict(precision="fp16"), "precision must be one of 'mixed', 'fp32'; got 'fp16'"),
        (dict(recompute="some"), "recompute must be one of 'none', 'selective', 'full'; got 'some'"),
        (dict(tp=0), "tp must be a positive integer, got 0"),
    ],
)
def test_training_memory_refuses_bad_inputs(kwargs, message):
    with pytest.raises(ValueError) as err:
        training_memory(LLAMA_8B, **{"seq_len": 1024, "micro_batch": 1, **kwargs})
    assert message in str(err.value)


@pytest.mark.parametrize("precision", ["mixed", "fp32"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_training_memory_combines_state_and_activations(precision, recompute):
    from playbook.theory.inventory.activations import model_activation_bytes

    got = training_memory(LLAMA_8B, seq_len=4096, micro_batch=2, dp=8, zero=2, precision=precision, recompute=recompute)
    state = model_state_bytes(8_030_261_248, dp=8, zero=2, precision=precision)
    assert (got.params, got.grads, got.optimizer) == (state.params, state.grads, state.optimizer)
    expected = model_activation_bytes(
        LLAMA_8B, seq_len=4096, micro_batch=2, dtype_bytes=2 if precision == "mixed" else 4, recompute=recompute
    )
    assert got.activations == pytest.approx(expected)
    # whatever else it keeps, full recomputation saves at least every layer's input: L · s · b · h elements
    elem = 2 if precision == "mixed" else 4
    assert got.activations >= 32 * 4096 * 2 * 4096 * elem


def test_training_memory_recompute_order_and_zero():
    def acts(r):
        return training_memory(LLAMA_8B, seq_len=2048, micro_batch=1, recompute=r).activations

    assert acts("none") >= acts("selective") >= acts("full") > 0
    # Llama 3.1 8B, mixed, no sharding: 16 bytes × 8,030,261,248 = 128,484,179,968 bytes of model state
    base = training_memory(LLAMA_8B, seq_len=2048, micro_batch=1)
    assert base.params + base.grads + base.optimizer == 128_484_179_968


def test_korthikanti_beside_our_exact_block_for_llama_8b():
    from playbook.theory.inventory.activations import korthikanti_vs_exact

    (row,) = korthikanti_vs_exact(LLAMA_8B, [4096])  # s = 4096, b = 1, 16-bit
    # Korthikanti Table 2: sbh(34 + 5as/h) with sbh = 4096·1·4096 and 5as/h = 5·32·4096/4096 = 160
    assert row["korthikanti"] == 4096 * 4096 * 194 == 3_254_779_904
    # ours: 2·(6bsh + 2bs + 4·b·a·s·d + b·a·s² + 4·b·s·f) + s², d = 128, f = 14336
    ours = 2 * (6 * 4096 * 4096 + 2 * 4096 + 4 * 32 * 4096 * 128 + 32 * 4096**2 + 4 * 4096 * 14336) + 4096**2
    assert row["ours"] == ours == 1_895_841_792
    # selective: minus the probabilities, the mask and the (a - g) = 24 extra heads of repeated k and v
    assert row["ours_selective"] == ours - 2 * 32 * 4096**2 - 4096**2 - 2 * 24 * 4096 * 128 * 2
    assert row["ratio"] == pytest.approx(ours / 3_254_779_904)


def test_chapter0_korthikanti_agrees_with_ours_only_at_short_sequences():
    from playbook.theory.inventory.activations import korthikanti_over_exact_limit, korthikanti_vs_exact

    rows = korthikanti_vs_exact(LLAMA_8B, [512, 1024, 2048])
    assert [round(r["ratio"], 2) for r in rows] == [1.04, 0.87, 0.71]  # ours / paper: a few percent at 512 only
    # the s² terms: 5·a bytes per score (paper) against 2·a + 1 (ours), a = 32 heads
    assert (
        korthikanti_over_exact_limit(LLAMA_8B)
        == pytest.approx(5 * 32 / (2 * 32 + 1))
        == pytest.approx(2.4615, abs=1e-4)
    )


# ---- serving -----------------------------------------------------------------------------------
def test_kv_cache_per_token():
    # vLLM §3 with GQA: 2 (K and V) · layers · kv_heads · head_dim · bytes
    assert kv_cache_bytes_per_token(LLAMA_8B) == 131_072  # 2·32·8·128·2
    assert kv_cache_bytes_per_token(ModelConfig.preset("llama-3.1-70b")) == 327_680  # 2·80·8·128·2
    assert kv_cache_bytes_per_token(LLAMA_8B, "fp8") == 65_536
    assert kv_cache_bytes_per_token(LLAMA_8B, "int4") == 32_768
    assert kv_cache_bytes_per_token(LLAMA_8B, "fp32") == 262_144
    # MLA (DeepSeek-V2 §2.1): layers · (kv_lora_rank + rope dim) · bytes = 61·(512+64)·2
    assert kv_cache_bytes_per_token(ModelConfig.preset("deepseek-v3")) == 70_272


def test_kv_cache_refuses_unknown_dtype():
    with pytest.raises(
        ValueError, match="dtype must be one of 'fp32', 'bf16', 'fp16', 'fp8', 'int8', 'int4'; got 'fp64'"
    ):
        kv_cache_bytes_per_token(LLAMA_8B, "fp64")


def test_llama_70b_bf16_weights_are_about_140_gb():
    got = inference_memory(ModelConfig.preset("llama-3.1-70b"), batch=1, seq_len=1)
    assert isinstance(got, InferenceMemory)
    assert got.weights == 2 * 70_553_706_496  # 141,107,412,992 bytes
    assert bytes_to_gb(got.weights) == pytest.approx(140, rel=0.01)  # the "70B × 2 bytes" rule of thumb


def test_inference_memory_kv_and_sharding():
    # 4 sequences × 8192 tokens × 131,072 bytes = 2^2 · 2^13 · 2^17 = 2^32 bytes = 4 GiB
    one = inference_memory(LLAMA_8B, batch=4, seq_len=8192)
    assert bytes_to_gib(one.kv_cache) == 4.0
    assert one.weights == 2 * 8_030_261_248
    assert one.as_dict()["total"] == one.weights + one.kv_cache

    tp8 = inference_memory(LLAMA_8B, batch=4, seq_len=8192, tp=8)  # one KV head per rank
    assert bytes_to_gib(tp8.kv_cache) == 0.5
    assert tp8.weights == one.weights / 8

    # tp=16 > 8 KV heads: each KV head is replicated on 2 ranks, so the cache per rank stops shrinking
    tp16 = inference_memory(LLAMA_8B, batch=4, seq_len=8192, tp=16)
    assert tp16.kv_cache == tp8.kv_cache
    assert tp16.weights == one.weights / 16

    pp2 = inference_memory(LLAMA_8B, batch=4, seq_len=8192, pp=2)
    assert (pp2.weights, pp2.kv_cache) == (one.weights / 2, one.kv_cache / 2)

    fp8 = inference_memory(LLAMA_8B, batch=4, seq_len=8192, dtype="fp8")
    assert (fp8.weights, fp8.kv_cache) == (one.weights / 2, one.kv_cache / 2)


def test_mla_cache_is_not_split_by_tp():
    ds = ModelConfig.preset("deepseek-v3")
    one = inference_memory(ds, batch=1, seq_len=1000)
    tp8 = inference_memory(ds, batch=1, seq_len=1000, tp=8)
    assert one.kv_cache == tp8.kv_cache == 70_272_000  # 1000 tokens × 70,272 bytes
    assert tp8.weights == one.weights / 8


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(batch=0), "batch must be a positive integer, got 0"),
        (dict(seq_len=-1), "seq_len must be a positive integer, got -1"),
        (dict(tp=3), "tp=3 does not divide n_heads=32; try tp in {1, 2, 4, 8, 16, 32}"),
        (dict(pp=33), "pp=33 exceeds n_layers=32"),
        (dict(pp=0), "pp must be a positive integer, got 0"),
        (dict(dtype="float8"), "dtype must be one of"),
    ],
)
def test_inference_memory_refuses_bad_inputs(kwargs, message):
    with pytest.raises(ValueError) as err:
        inference_memory(LLAMA_8B, **{"batch": 1, "seq_len": 128, **kwargs})
    assert message in str(err.value)


def test_tp_must_split_kv_heads_evenly():
    # 12 query heads, 4 KV heads, tp = 6: 6 neither divides 4 nor is a multiple of it.
    # Valid: divisors of 12 that divide 4 (1, 2, 4) or are multiples of 4 (12).
    cfg = ModelConfig(vocab_size=100, hidden=96, n_layers=2, n_heads=12, n_kv_heads=4, ffn_hidden=64, max_seq_len=64)
    with pytest.raises(ValueError, match=r"tp=6 cannot split n_kv_heads=4 evenly.*try tp in \{1, 2, 4, 12\}"):
        inference_memory(cfg, batch=1, seq_len=8, tp=6)


def test_fast_enough_for_a_slider():
    start = time.perf_counter()
    for i in range(1, 1001):
        model_state_bytes(7.5e9, dp=i, zero=i % 4)
        activation_bytes_per_layer(**GPT3, tp=8, sequence_parallel=bool(i % 2))
        inference_memory(LLAMA_8B, batch=i, seq_len=4096, tp=8)
    assert time.perf_counter() - start < 1.0


def test_inference_memory_with_experts_split():
    moe = ModelConfig.preset("gpt-tiny-moe")
    routed = 2 * 4 * 3 * 64 * 64  # 2 MoE layers × 4 experts × 3·h·f_e
    got = inference_memory(moe, batch=1, seq_len=16, ep=4, dtype="bf16")
    assert got.weights == 2 * ((131_904 - routed) + routed / 4)  # one expert of four per rank


# ---- chapter 0's corrected claims ------------------------------------------------------------------
def test_chapter0_fp32_training_holds_as_much_model_state_as_mixed_precision():
    # 4 + 4 + 8 = 16 bytes in fp32, 2 + 2 + 12 = 16 mixed, 2 + (2 + 4) + 12 = 20 with an fp32 grad buffer
    assert model_state_bytes(PSI, precision="fp32").total == model_state_bytes(PSI, precision="mixed").total == 16 * PSI
    assert model_state_bytes(PSI, precision="mixed", fp32_grad_accum=True).total == 20 * PSI
    assert model_state_bytes(PSI, precision="mixed", fp32_grad_accum="main_grad").total == 18 * PSI


@pytest.mark.parametrize("name, ratio", [("llama-3.1-8b", 4), ("llama-3.1-70b", 8), ("llama-3.1-405b", 16)])
def test_chapter0_gqa_shrinks_the_kv_cache_by_query_over_kv_heads(name, ratio):
    # 8 key/value heads in every size; 32, 64 and 128 query heads
    cfg = ModelConfig.preset(name)
    mha = kv_cache_bytes_per_token(cfg.replace(n_kv_heads=None))
    assert mha == ratio * kv_cache_bytes_per_token(cfg)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_chapter0_pipeline_cuts_weights_not_peak_activations(pp):
    # 1F1B: stage 0 holds p micro-batches of L/p layers = one micro-batch of all L layers (less the head)
    cfg = ModelConfig.preset("llama-3.1-70b")
    sizes = dict(seq_len=4096, micro_batch=1)
    alone, piped = training_memory(cfg, **sizes), training_memory(cfg, **sizes, pp=pp)
    assert piped.activations > 0.98 * alone.activations
    assert piped.params < 1.1 * alone.params / pp


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_every_view_reads_the_one_inventory(recompute, attention):
    """Tensor parallelism at tp=1 and the rank's view at tp=cp=1 are the plain block tensor for tensor
    (``theory.inventory.inventory``: one list, viewed per recomputation mode), and context parallelism's ring
    core under "selective" keeps RoPE's tables and the core's inputs, as ``parallel.hybrid.recompute``
    checkpoints it."""
    from playbook.dims import ParallelDims
    from playbook.theory.inventory.activations import block_activation_breakdown
    from playbook.theory.inventory.inventory import view
    from playbook.theory.hybrid.local_activations import activation_pieces, block_bytes
    from playbook.theory.tp.tp import tp_block_activation_breakdown

    cfg, sizes = ModelConfig.preset("gpt-tiny"), dict(seq_len=32, micro_batch=2, recompute=recompute)
    plain = block_activation_breakdown(cfg, **sizes, attention=attention)
    assert tp_block_activation_breakdown(cfg, **sizes, tp=1, attention=attention) == plain
    assert block_bytes(cfg, **sizes, attention=attention) == sum(plain.values())
    if attention == "eager":
        piece = activation_pieces(cfg, ParallelDims(), seq_len=32, micro_batch=2, recompute=recompute)["block"]
        assert piece == sum(plain.values())
    ring = activation_pieces(cfg, ParallelDims(cp=2), seq_len=32, micro_batch=2, recompute="selective")["block"]
    b, s, h, f, a, g, d = 2, 16, cfg.hidden, cfg.ffn_hidden, cfg.n_heads, cfg.kv_heads, cfg.dim_head
    outside = 4 * (b * s * (6 * h + 2 + a * d + 4 * f) + 4 * s * d)  # norms, o_proj input, MLP, RoPE tables
    assert ring == outside + 4 * b * s * (a + 2 * g) * d  # + q, k, v: the checkpoint's inputs
    with pytest.raises(ValueError, match="recompute must be one of"):
        view([], "some")


@pytest.mark.parametrize("sp", [False, True])
def test_an_moe_block_under_tp_at_even_routing_is_the_hybrids_exact_count(sp):
    """``training_memory``'s MoE block under tp (every degree together, ``theory.hybrid.local_activations``)
    is the count the hybrid checks to the byte on real ranks (``theory.hybrid.moe.moe_block_bytes``)
    for routing that sends k·T/E slots to every expert: each tp rank routes its 32 of the 64 tokens."""
    from playbook.dims import ParallelDims
    from playbook.theory.hybrid.moe import moe_block_bytes
    from playbook.theory.hybrid.local_activations import block_bytes

    cfg = ModelConfig.preset("gpt-tiny-moe")
    even = {"counts_by_rank": [[2 * 32 // 4] * 4], "capacity": None}  # k·T/E slots per expert, one data rank
    exact = moe_block_bytes(
        cfg, ParallelDims(tp=2), rank=0, micro_batch=2, seq_len=32, layer=even, sequence_parallel=sp
    )
    assert block_bytes(cfg, True, seq_len=32, micro_batch=2, tp=2, sequence_parallel=sp) == exact


def test_zero_with_context_parallelism_alone_shards_over_dp_times_cp():
    """ZeRO's data ranks are dp·cp (the ranks that hold the same weights: cp replicates them), on the
    path where cp is the only split as on every other (issue 41, cause 6). By hand for gpt-tiny in
    fp32 at ZeRO-3: every category is 1/(dp·cp) of the unsharded 4 + 4 + 8 bytes per parameter."""
    tiny = ModelConfig.preset("gpt-tiny")
    n = tiny.num_params()
    got = training_memory(tiny, seq_len=64, micro_batch=8, dp=2, cp=2, zero=3, precision="fp32")
    assert (got.params, got.grads, got.optimizer) == (4 * n / 4, 4 * n / 4, 8 * n / 4)
    from playbook.theory.hybrid.stages import layout_stage_memory, most_loaded_stage

    for zero in (1, 2, 3):
        kw = dict(seq_len=4096, micro_batch=1, dp=4, cp=4, zero=zero)
        llama = ModelConfig.preset("llama-3.1-8b")
        stages = layout_stage_memory(llama, **kw)
        want = stages[most_loaded_stage(stages)].memory
        alone = training_memory(llama, **kw)
        assert (alone.params, alone.grads, alone.optimizer) == pytest.approx((want.params, want.grads, want.optimizer))
