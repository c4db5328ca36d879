"""The profiler's memory timeline of one step (``measure.memory_timeline``) against the package's exact counts:
model state to the byte, the activations at the forward's end to the byte once the three things the
profiler files differently are named, and the peak where the chapter-9 lab says (the lab's own
configuration: the small GPT at 128 tokens, 8 sequences, eager attention)."""

from __future__ import annotations

import pytest
import torch

from playbook.config import ModelConfig
from playbook.data import SyntheticTask
from playbook.measure.memory_timeline import CATEGORIES, profile_step
from playbook.model.gpt import GPT
from playbook.theory.hybrid import training_memory
from playbook.theory.inventory.activations import block_activation_bytes, model_activation_bytes

LAB = ModelConfig.preset("gpt-tiny").replace(max_seq_len=128)  # chapter 9, §6
SEQ, BATCH, BUDGET = 128, 8, 12e6
GQA = ModelConfig(vocab_size=50, hidden=48, n_layers=3, n_heads=6, n_kv_heads=3, ffn_hidden=100, max_seq_len=16)


def run(cfg, seq, batch, recompute="none", micro_batches=1, fused=True):
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(0, batch, seq)  # [batch, seq]
    model = GPT(cfg, recompute=recompute)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)  # fused: as the chapter
    return profile_step(model, optimizer, tokens, targets, micro_batches=micro_batches)


@pytest.fixture(scope="module")
def lab():
    """The lab's step, its two fixes, and another model (3 layers, 6 query heads on 3 KV heads, vocabulary 50)."""
    return {
        "step": run(LAB, SEQ, BATCH),
        "2 micro-batches": run(LAB, SEQ, BATCH, micro_batches=2),
        "full recompute": run(LAB, SEQ, BATCH, recompute="full"),
        "other model, selective": run(GQA, 16, 2, recompute="selective", fused=False),  # AdamW tensor by tensor
    }


def profiler_activations(cfg, seq, micro_batch, recompute):
    """What the profiler calls activations at a forward's end: chapter 0's count of what autograd saves
    (``model_activation_bytes``), plus the logits the forward returns [b, s, V] and the 4-byte loss (the
    caller holds them), less the int64 token ids and targets [b, s] and, where the attention core is not
    recomputed, each layer's bool causal mask [s, s] (made from no parameter: the profiler files them as inputs)."""
    b, s = micro_batch, seq
    masks = cfg.n_layers * s * s if recompute == "none" else 0
    saved = model_activation_bytes(cfg, seq_len=s, micro_batch=b, recompute=recompute)
    return saved + 4 * b * s * cfg.vocab_size + 4 - 2 * 8 * b * s - masks


def test_model_state_is_the_prediction_to_the_byte_all_step(lab):
    for key, cfg in (("step", LAB), ("full recompute", LAB), ("other model, selective", GQA)):
        tl = lab[key]
        m = training_memory(cfg, seq_len=32, micro_batch=1, precision="fp32", n_tensors=cfg.num_param_tensors())
        assert set(tl.series) == set(CATEGORIES)
        assert set(tl.series["params"]) == {m.params}  # 4 bytes per parameter, from start to end
        assert set(tl.series["optimizer"]) == {m.optimizer}  # AdamW's two moments and a step per tensor
        assert tl.series["grads"][-1] == m.grads  # every gradient, once the backward is over
        assert tl.raw_rise == tl.peak - tl.total[0]  # the raw allocator events rise as the categorised total


@pytest.mark.parametrize(
    "key,cfg,seq,micro_batch,recompute,last",
    [
        ("step", LAB, SEQ, BATCH, "none", "forward 1"),
        ("2 micro-batches", LAB, SEQ, BATCH // 2, "none", "forward 2"),
        ("full recompute", LAB, SEQ, BATCH, "full", "forward 1"),
        ("other model, selective", GQA, 16, 2, "selective", "forward 1"),
    ],
)
def test_activations_at_the_forward_s_end_are_chapter_0_s_count(lab, key, cfg, seq, micro_batch, recompute, last):
    held = lab[key].end_of(last)
    assert held["activations"] == profiler_activations(cfg, seq, micro_batch, recompute)
    assert held["autograd detail"] == 0  # nothing of the backward yet


def test_the_lab_s_step_peaks_at_the_start_of_backward_over_the_budget(lab):
    step = lab["step"]
    forward = step.end_of("forward 1")
    top = step.at(step.peak_index)
    assert step.phase_at(step.peak_ms) == "backward 1"
    assert step.peak >= sum(forward.values()) and step.peak > BUDGET
    # the last block's activations are still held at the peak: only the head's have gone
    assert top["activations"] > forward["activations"] - block_activation_bytes(LAB, seq_len=SEQ, micro_batch=BATCH)
    # beside them, the backward's first gradients: the logits' [b, s, V] and those inside the last block's
    # MLP ([b, s, f] each), and the first parameters' (the backward runs the head, the final norm, then down_proj)
    b, s, h, f, V = BATCH, SEQ, LAB.hidden, LAB.ffn_hidden, LAB.vocab_size
    assert top["autograd detail"] >= 4 * b * s * V + 4 * b * s * f
    assert top["grads"] == 4 * (V * h + h + f * h)


def test_two_micro_batches_halve_the_activations_and_hold_every_gradient_beside_the_second(lab):
    step, two = lab["step"], lab["2 micro-batches"]
    assert list(two.phases) == ["forward 1", "backward 1", "forward 2", "backward 2", "optimizer"]
    grads = training_memory(LAB, seq_len=SEQ, micro_batch=BATCH, precision="fp32").grads
    assert two.end_of("forward 1")["grads"] == 0 and two.end_of("forward 2")["grads"] == grads
    assert two.phase_at(two.peak_ms) == "backward 2"
    assert two.peak < BUDGET < step.peak


def test_full_recompute_keeps_block_inputs_but_runs_each_block_again_inside_the_backward(lab):
    step, full = lab["step"], lab["full recompute"]
    top = full.at(full.peak_index)
    assert full.phase_at(full.peak_ms) == "backward 1"
    # a block recomputed in the backward holds all its saved tensors at once, beside the model state ...
    block = block_activation_bytes(LAB, seq_len=SEQ, micro_batch=BATCH)
    assert full.peak >= top["params"] + top["optimizer"] + block
    # ... and, made by the backward, they are autograd detail, all but the block's input (kept: an activation)
    # and its causal mask (an input)
    assert top["autograd detail"] >= block - 4 * BATCH * SEQ * LAB.hidden - SEQ * SEQ
    assert top["activations"] < full.end_of("forward 1")["activations"]
    assert full.peak < BUDGET < step.peak and full.peak > lab["2 micro-batches"].peak


def test_bad_input_is_one_line_naming_the_constraint():
    cfg = ModelConfig.preset("gpt-tiny")
    model = GPT(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(0, 4, 8)
    for bad, match in ((0, "positive integer"), (True, "positive integer"), (3, "divisible by micro_batches=3")):
        with pytest.raises(ValueError, match=match):
            profile_step(model, opt, tokens, targets, micro_batches=bad)
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        profile_step(model, opt, tokens[0], targets[0])
    with pytest.raises(ValueError, match="shape of tokens"):
        profile_step(model, opt, tokens, targets[:2])


def test_end_of_an_unknown_phase_names_the_phases(lab):
    with pytest.raises(ValueError, match="'forward 1', 'backward 1', 'optimizer'"):
        lab["step"].end_of("forward 2")


def test_the_profiled_step_is_the_plain_step_micro_batches_and_all():
    """The step under the profiler trains as a plain full-batch step does (parity with one process, plain
    SGD so the update is the gradient itself): accumulating 2 micro-batches gives the whole batch's mean."""
    cfg = ModelConfig.preset("gpt-tiny")
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(3, 4, 16)  # [4, 16]
    profiled, plain = GPT(cfg, seed=1), GPT(cfg, seed=1)
    profile_step(
        profiled, torch.optim.SGD(profiled.parameters(), lr=1.0), tokens, targets, micro_batches=2, warmup=False
    )
    plain(tokens, targets)[1].backward()
    torch.optim.SGD(plain.parameters(), lr=1.0).step()
    for (name, a), b in zip(profiled.named_parameters(), plain.parameters()):
        assert torch.isfinite(a).all() and torch.allclose(a, b, rtol=0, atol=1e-6), name
