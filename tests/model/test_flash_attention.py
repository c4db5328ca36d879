"""Activations with a fused FlashAttention kernel (Dao et al. 2022, arXiv:2205.14135) beside our
eager attention: by hand from the shapes, measured on torch's own CPU flash kernel, through every
``training_memory`` path, and in the planner (``attention="flash"``, what ``playbook plan`` counts).

Every expected value is derived here from the tensor shapes; none is copied from the code under test.
"""

from __future__ import annotations

import json

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.inventory.activations import block_activation_bytes, model_activation_bytes
from playbook.theory.hybrid.memory import training_memory

TINY = ModelConfig.preset("gpt-tiny")  # hidden 64, 2 layers, 4 heads, 2 KV heads, head dim 16, ffn 176


def eager_minus_flash(*, b: int, s: int, a: int, g: int, d: int, B: int, mask: int) -> int:
    """Bytes one block saves with eager attention and not with a flash kernel, from the shapes:
    the softmax probabilities [b, a, s, s] and the bool causal mask (``mask`` bytes), the copies of k
    and v repeated from g to a heads (a flash kernel reads the g heads), less the kernel's fp32
    log-sum-exp [b, a, s] that eager attention does not keep."""
    probs = b * a * s * s * B
    repeats = 2 * b * (a - g) * s * d * B
    lse = b * a * s * 4
    return probs + mask + repeats - lse


# ---- by hand ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_heads", [2, 4])  # gpt-tiny's GQA, and plain multi-head attention
@pytest.mark.parametrize("dtype_bytes", [2, 4])
def test_block_and_model_by_hand(kv_heads, dtype_bytes):
    cfg = TINY.replace(n_kv_heads=kv_heads)
    b, s, a, d, B = 2, 16, 4, 16, dtype_bytes
    sizes = dict(seq_len=s, micro_batch=b, dtype_bytes=B)
    eager = block_activation_bytes(cfg, **sizes)
    flash = block_activation_bytes(cfg, **sizes, attention="flash")
    delta = eager_minus_flash(b=b, s=s, a=a, g=kv_heads, d=d, B=B, mask=s * s)
    assert eager - flash == delta
    if kv_heads == a:  # multi-head: exactly the s² tensors (probabilities, mask) less the log-sum-exp
        assert eager - flash == b * a * s * s * B + s * s - 4 * b * a * s
    # flash = selective recomputation's tensors + the fp32 statistics (Korthikanti et al. 2022, §5)
    assert flash - block_activation_bytes(cfg, **sizes, recompute="selective") == 4 * b * a * s
    for recompute in ("selective", "full"):  # recomputing the kernel keeps no statistics; full keeps the input
        assert block_activation_bytes(cfg, **sizes, recompute=recompute, attention="flash") == block_activation_bytes(
            cfg, **sizes, recompute=recompute
        )
    whole = model_activation_bytes(cfg, **sizes) - model_activation_bytes(cfg, **sizes, attention="flash")
    assert whole == cfg.n_layers * delta  # the ends (tokens, head, loss) do not depend on the kernel


def test_unknown_kernel_is_one_line():
    with pytest.raises(ValueError, match=r"^attention must be one of 'eager', 'flash'; got 'sdpa'$"):
        block_activation_bytes(TINY, seq_len=16, micro_batch=2, attention="sdpa")
    with pytest.raises(ValueError, match="attention must be one of 'eager', 'flash'"):
        training_memory(TINY, seq_len=16, micro_batch=2, attention="Flash")


# ---- measured on a real flash kernel --------------------------------------------------------------
@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize("dtype_name, dtype_bytes", [("float32", 4), ("bfloat16", 2)])
def test_torch_cpu_flash_kernel_saves_what_we_predict(dtype_name, dtype_bytes, recompute):
    """Our GPT with its attention core swapped for torch's fused CPU kernel
    (``scaled_dot_product_attention`` forced to the FLASH_ATTENTION backend, GQA read natively):
    every storage autograd saves, counted by ``SavedActivations``, equals the flash prediction."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from playbook.data import SyntheticTask
    from playbook.measure import SavedActivations
    from playbook.model.gpt import GPT

    def flash_core(q, k, v):  # q [b, a, s, d], k and v [b, g, s, d] -> [b, a, s, d]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    model = GPT(TINY, recompute=recompute).to(getattr(torch, dtype_name))
    for block in model.blocks:
        block.attn.core = flash_core
    b, s = 2, 16
    tokens, targets = SyntheticTask(TINY.vocab_size).batch(0, b, s)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        with SavedActivations(model) as saved:
            _, loss = model(tokens, targets)
        loss.backward()
    sizes = dict(seq_len=s, micro_batch=b, dtype_bytes=dtype_bytes, recompute=recompute)
    assert saved.bytes == model_activation_bytes(TINY, **sizes, attention="flash")
    lse = [t for t in saved.tensors if t.shape == (b, TINY.n_heads, s)]
    if recompute == "none":  # one fp32 [b, a, s] log-sum-exp per layer, whatever the model's dtype
        assert [t.dtype for t in lse] == ["float32"] * TINY.n_layers
    else:
        assert lse == []
    assert not [t for t in saved.tensors if t.shape[-2:] == (s, s) and t.dtype == "bool"]  # no causal mask


# ---- every training_memory path -----------------------------------------------------------------
@pytest.mark.parametrize(
    "name, degrees, heads, kv_heads, stage0",
    [
        # (degrees, heads and KV heads per rank, (layers on the most loaded stage, micro-batches in flight))
        ("gpt-tiny", dict(pp=2), 4, 2, (1, 2)),  # pipeline_stage_memory
        ("gpt-tiny", dict(tp=2, sequence_parallel=True), 2, 1, (2, 1)),  # theory.tp
        ("gpt-tiny", dict(tp=2, pp=2, dp=2, zero=1), 2, 1, (1, 2)),  # layout_stage_memory
        ("gpt-tiny", dict(dp=2, zero=2), 4, 2, (2, 1)),  # the plain path
        ("gpt-tiny-moe", dict(ep=2, dp=2), 4, 2, (2, 1)),  # MoE blocks (theory.moe)
        ("gpt-tiny-moe", dict(pp=2), 4, 2, (1, 2)),  # MoE blocks in a pipeline
    ],
)
def test_flash_reaches_every_path(name, degrees, heads, kv_heads, stage0):
    cfg = ModelConfig.preset(name)
    b, s = 2, 32
    common = dict(seq_len=s, micro_batch=b, precision="mixed", **degrees)
    eager, flash = (training_memory(cfg, **common, attention=k) for k in ("eager", "flash"))
    layers, in_flight = stage0
    delta = eager_minus_flash(b=b, s=s, a=heads, g=kv_heads, d=16, B=2, mask=s * s)
    assert eager.activations - flash.activations == in_flight * layers * delta
    assert (eager.params, eager.grads, eager.optimizer) == (flash.params, flash.grads, flash.optimizer)


def test_flash_with_context_parallelism():
    """Eager at cp uses our ring kernel's exact count, itself flash-like (q, own K/V shard, output,
    fp32 log-sum-exp): it keeps a second copy of the output (the ring's, then the o_proj input) and
    RoPE's cos/sin gathered at the shard's positions, which a fused kernel does not."""
    b, s, cp, a, d, B = 2, 32, 2, 4, 16, 2
    common = dict(seq_len=s, micro_batch=b, precision="mixed", cp=cp)
    eager, flash = (training_memory(TINY, **common, attention=k).activations for k in ("eager", "flash"))
    n = s // cp
    assert eager - flash == TINY.n_layers * (b * a * n * d * B + 4 * n * d * B)
    # with tp as well (layout_stage_memory): TP's block at s/cp with a/t heads, against TP + ring
    both = dict(common, tp=2, sequence_parallel=True)
    eager, flash = (training_memory(TINY, **both, attention=k).activations for k in ("eager", "flash"))
    assert eager - flash == TINY.n_layers * (b * (a // 2) * n * d * B + 4 * n * d * B)
    # recomputation at cp: eager alone refuses it; flash counts the block at s/cp
    full = training_memory(TINY, **common, recompute="full", attention="flash").activations
    assert full < flash


# ---- the planner --------------------------------------------------------------------------------
def test_planner_fits_a_layout_eager_attention_rejects():
    """Llama-3.1-70B on 64 H100s at 8192 tokens: dp8 × tp8, ZeRO-3, b1, no recomputation. Eager
    attention keeps b·(a/t)·s² bf16 probabilities per layer (1 GB at a/t = 8): it cannot fit; with a
    flash kernel the same layout fits and is a candidate (eager can only take it with selective
    recomputation, which costs the attention forward again)."""
    from playbook.hardware import MEM_UTIL
    from playbook.theory.plan.search import Layout
    from playbook.theory.plan.memory import memory_bytes
    from playbook.theory.plan.planner import plan

    cfg, h100 = ModelConfig.preset("llama-3.1-70b"), Hardware.preset("h100-sxm")
    lay = Layout(dp=8, tp=8, pp=1, cp=1, ep=1, zero=3, micro_batch=1, microbatches=64, recompute="none")
    budget = MEM_UTIL * h100.capacity_bytes
    eager, flash = memory_bytes(cfg, lay, 8192, "eager", "ours"), memory_bytes(cfg, lay, 8192, "flash", "ours")
    assert flash <= budget < eager
    s, t = 8192, 8
    assert eager - flash == cfg.n_layers * eager_minus_flash(
        b=1, s=s, a=cfg.n_heads // t, g=cfg.kv_heads // t, d=cfg.dim_head, B=2, mask=s * s
    )
    run = dict(gpus=64, seq_len=s, global_batch=512, activations="ours")  # our model's two kernels
    with_flash, with_eager = plan(cfg, h100, **run), plan(cfg, h100, **run, attention="eager")
    assert (with_flash.attention, with_eager.attention) == ("flash", "eager")
    assert str(lay) in {str(c.layout) for c in with_flash.candidates}
    assert str(lay) not in {str(c.layout) for c in with_eager.candidates}
    assert all(c.memory <= budget for c in with_flash.candidates)
    with pytest.raises(ValueError, match=r"^attention must be one of eager, flash, got 'xformers'; try flash$"):
        plan(cfg, h100, **run, attention="xformers")


def test_cli_records_the_kernel(capsys):
    from playbook.cli import main

    argv = ["plan", "--model", "gpt-tiny", "--gpus", "2", "--hardware", "cpu-laptop", "--seq-len", "32"]
    argv += ["--global-batch", "8", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["attention"] == "flash"  # plan: what real clusters run
    assert main([*argv, "--attention", "eager"]) == 0
    assert json.loads(capsys.readouterr().out)["attention"] == "eager"
    memory = ["memory", "--model", "llama-3.1-8b", "--seq-len", "4096", "--json"]
    assert main(memory) == 0
    eager = json.loads(capsys.readouterr().out)
    assert eager["attention"] == "eager"  # memory: our model, as chapter 0 measures it
    assert main([*memory, "--attention", "flash"]) == 0
    flash = json.loads(capsys.readouterr().out)
    cfg = ModelConfig.preset("llama-3.1-8b")
    per_layer = eager_minus_flash(b=1, s=4096, a=cfg.n_heads, g=cfg.kv_heads, d=cfg.dim_head, B=2, mask=4096**2)
    assert eager["training"]["activations"] - flash["training"]["activations"] == cfg.n_layers * per_layer
    with pytest.raises(SystemExit):  # argparse's choices, as for --recompute
        main([*memory, "--attention", "sdpa"])
    assert "argument --attention: invalid choice: 'sdpa'" in capsys.readouterr().err.splitlines()[-1]
