"""Measured memory by category equals the exact predictions: params, grads, AdamW state, activations."""

import subprocess
import sys

import pytest
import torch

from playbook.config import ModelConfig
from playbook.data import SyntheticTask
from playbook.measure import SavedActivations, measure_training_step, optimizer_bytes, parameter_bytes
from playbook.model.gpt import GPT
from playbook.theory.inventory.activations import (
    block_activation_breakdown,
    block_activation_bytes,
    model_activation_breakdown,
    model_activation_bytes,
)


def saved_bytes(model, tokens, targets):
    with SavedActivations(model) as saved:
        _, loss = model(tokens, targets)
    loss.backward()
    return saved


@pytest.mark.parametrize("tie", [False, True])
def test_training_step_params_grads_adamw_exact(tie):
    cfg = ModelConfig.preset("gpt-tiny").replace(tie_embeddings=tie)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert optimizer_bytes(opt) == 0
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(0, 4, 16)
    snap = measure_training_step(model, opt, tokens, targets)
    psi = cfg.num_params()
    n_tensors = len(list(model.parameters()))
    assert snap.params == 4 * psi
    assert snap.grads == 4 * psi
    assert snap.optimizer == 8 * psi + 4 * n_tensors  # exp_avg, exp_avg_sq, and a 4-byte step per tensor
    assert snap.activations == model_activation_bytes(cfg, seq_len=16, micro_batch=4)
    assert snap.peak == snap.params + snap.grads + snap.optimizer + snap.activations
    assert snap.cuda_allocated is None
    assert set(snap.as_dict()) == {
        "params",
        "grads",
        "optimizer",
        "activations",
        "peak",
        "cuda_allocated",
        "cuda_reserved",
    }
    assert parameter_bytes(model) == 4 * psi


@pytest.mark.parametrize("name", ["gpt-tiny", "gpt-small"])
@pytest.mark.parametrize("micro_batch,seq_len", [(1, 8), (2, 16), (4, 32), (3, 64)])
def test_saved_activations_equal_prediction(name, micro_batch, seq_len):
    cfg = ModelConfig.preset(name)
    model = GPT(cfg)
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(0, micro_batch, seq_len)
    measured = saved_bytes(model, tokens, targets).bytes
    assert measured == model_activation_bytes(cfg, seq_len=seq_len, micro_batch=micro_batch)


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(vocab_size=50, hidden=48, n_layers=3, n_heads=6, n_kv_heads=3, ffn_hidden=100, max_seq_len=16),
        ModelConfig(
            vocab_size=64, hidden=64, n_layers=2, n_heads=8, ffn_hidden=96, max_seq_len=32, tie_embeddings=True
        ),
        ModelConfig(
            vocab_size=17, hidden=40, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=12, head_dim=12
        ),
    ],
    ids=["gqa", "mha-tied", "head_dim"],
)
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_saved_activations_other_configs_and_recompute(cfg, recompute):
    model = GPT(cfg, recompute=recompute)
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(1, 2, cfg.max_seq_len)
    measured = saved_bytes(model, tokens, targets).bytes
    assert measured == model_activation_bytes(cfg, seq_len=cfg.max_seq_len, micro_batch=2, recompute=recompute)


def test_activation_formula_closed_form():
    cfg = ModelConfig.preset("gpt-small")
    b, s, h, a, g, d, f, V, L = 2, 32, 128, 8, 4, 16, 352, 128, 4
    for B in (2, 4):
        block = B * (6 * b * s * h + 2 * b * s + 4 * b * a * s * d + b * a * s * s + 4 * b * s * f) + s * s
        assert block_activation_bytes(cfg, seq_len=s, micro_batch=b, dtype_bytes=B) == block
        model = 16 * b * s + L * block + B * (3 * b * s * h + b * s + b * s * V + 1)
        assert model_activation_bytes(cfg, seq_len=s, micro_batch=b, dtype_bytes=B) == model
        sel = block - B * b * a * s * s - s * s - 2 * B * b * (a - g) * s * d
        assert block_activation_bytes(cfg, seq_len=s, micro_batch=b, dtype_bytes=B, recompute="selective") == sel
        assert block_activation_bytes(cfg, seq_len=s, micro_batch=b, dtype_bytes=B, recompute="full") == B * b * s * h
    parts = block_activation_breakdown(cfg, seq_len=s, micro_batch=b)
    assert parts["attention probabilities"] == 4 * b * a * s * s
    assert model_activation_breakdown(cfg, seq_len=s, micro_batch=b)["blocks"] == L * block_activation_bytes(
        cfg, seq_len=s, micro_batch=b
    )


def test_activation_argument_checks():
    cfg = ModelConfig.preset("gpt-tiny")
    with pytest.raises(ValueError, match="recompute"):
        block_activation_bytes(cfg, seq_len=8, micro_batch=1, recompute="partial")
    with pytest.raises(ValueError, match="seq_len"):
        model_activation_bytes(cfg, seq_len=0, micro_batch=1)


def test_moe_layers_swap_the_dense_mlp_terms_for_the_expert_estimate():
    dense = ModelConfig.preset("gpt-tiny")
    moe = dense.replace(n_experts=4, top_k=2, expert_ffn_hidden=8, n_shared_experts=1, n_dense_layers=1)
    b, s, B, h, f = 2, 8, 4, dense.hidden, dense.ffn_hidden
    dense_block = block_activation_bytes(dense, seq_len=s, micro_batch=b)
    # by hand: drop the four SwiGLU tensors (4bsf), add router probs bsE, dispatched copies bskh,
    # the SwiGLU tensors of k routed + 1 shared expert 4bs(k+1)f_e, and k combine weights per token
    moe_block = dense_block + B * (-4 * b * s * f + b * s * 4 + b * s * 2 * h + 4 * b * s * 3 * 8 + b * s * 2)
    assert block_activation_bytes(moe, seq_len=s, micro_batch=b, moe=True) == moe_block
    blocks = model_activation_breakdown(moe, seq_len=s, micro_batch=b)["blocks"]
    assert blocks == dense_block + moe_block  # layer 0 dense, layer 1 MoE


def test_saved_activations_dedup_and_exclusion():
    w = torch.nn.Parameter(torch.randn(5, 5))
    x = torch.randn(3, 5, requires_grad=True)
    with SavedActivations([w]) as saved:
        y = (x @ w).tanh()  # mm saves x and w; tanh saves its output
        z = x * x  # saves x twice: same storage
    assert saved.bytes == 3 * 5 * 4 + 3 * 5 * 4  # x once, tanh output; w excluded
    assert [s.made_by for s in saved.tensors] == ["leaf", "TanhBackward0"]
    (y.sum() + z.sum()).backward()
    assert x.grad is not None and w.grad is not None


def test_saved_tensors_are_not_copied():
    x = torch.randn(4, 4, requires_grad=True)
    saved = SavedActivations()
    assert saved._pack(x) is x and saved._unpack(x) is x
    assert saved.by_shape() == {((4, 4), "float32"): 64}
    # gradients through the hooks are those without them
    with SavedActivations():
        y = (x.sin() * x).sum()
    (g,) = torch.autograd.grad(y, x)
    assert torch.equal(g, torch.autograd.grad((x.sin() * x).sum(), x)[0])


def test_bf16_model_scales_with_dtype_bytes():
    cfg = ModelConfig.preset("gpt-tiny")
    model = GPT(cfg).to(torch.bfloat16)
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(0, 2, 16)
    measured = saved_bytes(model, tokens, targets).bytes
    assert measured == model_activation_bytes(cfg, seq_len=16, micro_batch=2, dtype_bytes=2)


def test_theory_module_does_not_import_torch():
    code = "import sys, playbook.theory.inventory.activations; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_after_backward_runs_before_grads_are_counted():
    cfg = ModelConfig.preset("gpt-tiny")
    model = GPT(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens, targets = SyntheticTask(cfg.vocab_size).batch(0, 2, 8)

    def drop_head_grad(m):  # a stand-in for a strategy that frees the gradients it does not own
        m.lm_head.weight.grad = None

    snap = measure_training_step(model, opt, tokens, targets, after_backward=drop_head_grad)
    assert snap.grads == 4 * (cfg.num_params() - cfg.vocab_size * cfg.hidden)
    assert snap.optimizer == 0  # plain SGD keeps no state
    assert snap.loss is not None and snap.loss.ndim == 0 and not snap.loss.requires_grad
