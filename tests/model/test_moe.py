"""The mixture-of-experts layer on one process (the ground truth) and its predictions, no ranks."""

import math

import pytest
import torch

from playbook.config import ModelConfig
from playbook.measure.memory import SavedActivations
from playbook.model.gpt import GPT
from playbook.model.gpt import build_moe as build
from playbook.model.moe import MoEMLP, configure, slot_positions, top_k_gating
from playbook.parallel.ep.model import train_moe
from playbook.parallel.training import TrainSetup, train
from playbook.theory.moe import moe as T

TINY = dict(vocab_size=8, hidden=2, n_layers=1, n_heads=1, ffn_hidden=4, max_seq_len=8)


def layer(n_experts=2, top_k=1, fe=4, shared=0, **kw):
    cfg = ModelConfig(**TINY, n_experts=n_experts, top_k=top_k, expert_ffn_hidden=fe, n_shared_experts=shared)
    return MoEMLP(cfg, **kw)


# ---- the preset and the model ------------------------------------------------------------------
def test_preset_counts_match_the_built_model():
    cfg = ModelConfig.preset("gpt-tiny-moe")
    model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    # by hand: gpt-tiny's attention and norms, plus per layer a 4x64 router and 4 SwiGLU experts of width 64
    dense = ModelConfig.preset("gpt-tiny")
    assert cfg.num_params() == dense.num_params() - 2 * 3 * 64 * 176 + 2 * (64 * 4 + 4 * 3 * 64 * 64)
    assert cfg.active_params() == cfg.num_params() - 2 * 2 * 3 * 64 * 64  # 2 of 4 experts idle per token
    assert len(list(model.parameters())) == T.param_tensors_per_rank(cfg) == 3 + 2 * (2 + 4 + 1 + 3 * 4)


def test_dense_model_is_unchanged_by_the_moe_code():
    cfg = ModelConfig.preset("gpt-tiny")
    tokens = torch.randint(cfg.vocab_size, (2, 8))
    logits, loss = GPT(cfg, seed=1)(tokens, tokens)
    assert torch.equal(loss, torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), tokens.reshape(-1)))
    assert GPT(cfg).aux_loss() == 0.0


def test_moe_loss_is_cross_entropy_plus_aux_of_every_layer():
    cfg = ModelConfig.preset("gpt-tiny-moe").replace(n_dense_layers=1, n_shared_experts=1)
    model = GPT(cfg)
    tokens = torch.randint(cfg.vocab_size, (2, 8))
    logits, loss = model(tokens, tokens)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), tokens.reshape(-1))
    assert torch.allclose(loss, ce + model.blocks[1].mlp.aux_loss)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


def test_total_vs_active_for_real_presets():
    mixtral = T.total_vs_active(ModelConfig.preset("mixtral-8x7b"))
    # Mistral: 46.7B total, 12.9B used per token (2 of 8 experts)
    assert round(mixtral["total"] / 1e9, 1) == 46.7 and 12.5e9 < mixtral["active"] < 13.2e9
    ds = T.total_vs_active(ModelConfig.preset("deepseek-v3"))
    assert round(ds["total"] / 1e9) == 671 and 36.5e9 < ds["active"] < 38e9  # 37B activated
    assert ds["active_fraction"] < 0.06


# ---- routing, capacity, aux loss ---------------------------------------------------------------
def test_capacity_follows_the_switch_formula():
    assert T.expert_capacity(64, 4, 1, 1.25) == 20  # 64 tokens / 4 experts * 1.25
    assert T.expert_capacity(64, 4, 2, 1.0) == 32  # top-2: k * T / E
    assert T.expert_capacity(40, 4, 1, 1.1) == 11  # 11.000000000000002 is still 11
    assert T.expert_capacity(10, 4, 1, 1.0) == 3  # 2.5 rounds up
    assert T.expert_capacity(10, 4, 1, None) is None


def test_aux_loss_is_alpha_under_uniform_routing():
    assert T.aux_loss_value([5, 5, 5, 5], [0.25] * 4, top_k=1, alpha=0.01) == pytest.approx(0.01)
    moe = layer(n_experts=4, top_k=2, aux_alpha=0.01)
    with torch.no_grad():
        moe.router.weight.zero_()  # every probability 1/E
    moe(torch.randn(1, 8, 2))
    assert moe.aux_loss.item() == pytest.approx(0.01, rel=1e-6)


def test_aux_loss_matches_a_hand_computed_example():
    moe = layer(n_experts=2, top_k=1, aux_alpha=0.01)
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([[math.log(3), 0.0], [0.0, math.log(3)]]))
    x = torch.tensor([[1.0, 0], [1, 0], [1, 0], [0, 1]])[None]  # probs .75/.25 three times, .25/.75 once
    moe(x)
    # f = (3/4, 1/4); P = ((3*.75 + .25)/4, (3*.25 + .75)/4) = (.625, .375); 0.01 * 2 * (.75*.625 + .25*.375)
    assert moe.aux_loss.item() == pytest.approx(0.01 * 2 * (0.75 * 0.625 + 0.25 * 0.375), rel=1e-6)
    assert moe.stats.counts == [3, 1] and moe.stats.aux == pytest.approx(0.01125, rel=1e-6)


def test_aux_loss_gradient_reaches_the_router():
    moe = layer(n_experts=4, top_k=2, aux_alpha=1.0)
    moe(torch.randn(1, 6, 2))
    moe.aux_loss.backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_no_drop_output_is_the_gated_sum_of_chosen_experts():
    torch.manual_seed(0)
    moe = layer(n_experts=4, top_k=2, shared=1)
    x = torch.randn(2, 5, 2)
    y = moe(x)
    flat = x.reshape(-1, 2)
    probs = torch.softmax(flat @ moe.router.weight.T, -1)
    for t in range(flat.shape[0]):
        top = probs[t].topk(2)
        want = sum(top.values[j] / top.values.sum() * moe.experts[int(top.indices[j])](flat[t]) for j in range(2))
        want = want + moe.shared_experts[0](flat[t])
        assert torch.allclose(y.reshape(-1, 2)[t], want, atol=1e-6)


def test_tokens_over_capacity_are_dropped_in_token_order():
    moe = layer(n_experts=2, top_k=1, capacity_factor=1.0)
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([[5.0, 5.0], [0.0, 0.0]]))  # every positive token picks expert 0
    x = torch.rand(1, 8, 2) + 0.5
    y = moe(x).reshape(-1, 2)
    # capacity = ceil(8 / 2 * 1.0) = 4: tokens 0-3 served by expert 0, tokens 4-7 dropped (output 0)
    assert moe.stats.capacity == 4 and moe.stats.kept == [4, 0] and moe.stats.dropped == 4
    probs = torch.softmax(x.reshape(-1, 2) @ moe.router.weight.T, -1)
    for t in range(4):
        assert torch.allclose(y[t], probs[t, 0] * moe.experts[0](x[0, t]), atol=1e-6)
    assert torch.equal(y[4:], torch.zeros(4, 2))


def test_slot_positions_and_global_offsets():
    experts = torch.tensor([[0, 1], [1, 0], [0, 2]])
    assert slot_positions(experts, 3).tolist() == [[0, 0], [1, 1], [2, 0]]
    assert slot_positions(experts, 3, torch.tensor([5, 0, 1])).tolist() == [[5, 0], [1, 6], [7, 1]]
    gates_experts, gates = top_k_gating(torch.tensor([[0.1, 0.6, 0.3]]), 2)
    assert gates_experts.tolist() == [[1, 2]] and torch.allclose(gates, torch.tensor([[2 / 3, 1 / 3]]))


def test_kept_counts_first_come_first_served_over_ranks():
    # capacity 3: rank 0 sends 2 and 4 slots, rank 1 sends 2 and 1
    assert T.kept_counts([[2, 4], [2, 1]], 3) == [[2, 3], [1, 0]]
    assert T.kept_counts([[2, 4], [2, 1]], None) == [[2, 4], [2, 1]]


# ---- errors ------------------------------------------------------------------------------------
def test_bad_settings_are_refused_clearly():
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        T.expert_capacity(8, 2, 1, 0.0)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        configure(GPT(ModelConfig.preset("gpt-tiny-moe")), capacity_factor=-1)
    with pytest.raises(ValueError, match=r"top_k=5 exceeds n_experts=4; try top_k in 1..4"):
        ModelConfig.preset("gpt-tiny-moe").replace(top_k=5)
    with pytest.raises(ValueError, match=r"ep=3 does not divide n_experts=4.*try ep in \{1, 2, 4\}"):
        T.check_ep(4, 3)
    with pytest.raises(ValueError, match=r"ep=4 does not divide dp=2"):
        T.check_ep(8, 4, 2)
    with pytest.raises(ValueError, match="dense"):
        build(ModelConfig.preset("gpt-tiny"))


# ---- the reference training loop ---------------------------------------------------------------
def test_moe_training_loop_equals_the_shared_one_with_default_settings():
    setup = TrainSetup(model="gpt-tiny-moe", steps=2, global_batch=4, seq_len=16)
    ours, shared = train_moe(setup, setup.config()), train(setup)
    assert ours.losses == shared.losses
    assert all(torch.equal(ours.params[k], shared.params[k]) for k in shared.params)
    ce = ours.ce[0]
    assert ce == pytest.approx(ours.losses[0] - sum(L["aux"] for L in ours.routing[0]), abs=1e-6)


# ---- predictions -------------------------------------------------------------------------------
def test_model_state_per_rank_with_ep_by_hand():
    cfg = ModelConfig.preset("gpt-tiny-moe")
    routed = 2 * 4 * 3 * 64 * 64  # two layers of four experts
    dense = cfg.num_params() - routed
    p = T.params_per_rank(cfg, ep=2)
    assert p == {"dense": dense, "experts": routed // 2, "total": dense + routed // 2}
    state = T.moe_model_state_bytes(cfg, ep=2, dp=2, precision="fp32")
    assert (state.params, state.grads, state.optimizer) == (4 * p["total"], 4 * p["total"], 8 * p["total"])
    # mixed precision with ZeRO-1 over dp=4 ranks, ep=2: dense Adam states over 4, expert states over 4/2
    z1 = T.moe_model_state_bytes(cfg, ep=2, dp=4, zero=1)
    assert z1.optimizer == pytest.approx(12 * dense / 4 + 12 * (routed // 2) / 2)
    assert T.moe_model_state_bytes(cfg).total == 16 * cfg.num_params()


def test_alltoall_rows_by_hand():
    # 2 ranks, 4 experts: rank 0 owns e0, e1; rank 1 owns e2, e3
    kept = [[3, 1, 2, 5], [4, 0, 1, 1]]
    rows = T.alltoall_rows(kept, ep=2)
    assert rows[0] == {"dispatch": 2 + 5, "combine": 4 + 0} and rows[1] == {"dispatch": 4 + 0, "combine": 2 + 5}
    assert T.alltoall_bytes_per_step(kept, 2, hidden=8) == [2 * (7 + 4) * 8 * 4, 2 * (4 + 7) * 8 * 4]
    assert T.uniform_alltoall_bytes(100, 2, 4, 8) == 2 * 100 * 8 * 4 * 3 / 4


def test_exact_activation_count_of_one_process():
    for cf, shared, dense in ((None, 0, 0), (1.0, 1, 1)):
        cfg = ModelConfig.preset("gpt-tiny-moe").replace(n_shared_experts=shared, n_dense_layers=dense)
        model = build(cfg, capacity_factor=cf)
        tokens = torch.randint(cfg.vocab_size, (3, 16))
        with SavedActivations(model) as saved:
            model(tokens, tokens.roll(1).clone())  # targets: their own storage
        layers = [m.stats.as_dict() for m in model.modules() if isinstance(m, MoEMLP)]
        assert saved.bytes == T.model_activation_bytes_moe(cfg, seq_len=16, micro_batch=3, layers=layers)


def test_simulated_routing_skew_and_capacity():
    even = T.simulate_routing(n_experts=4, top_k=1, tokens=400, capacity_factor=None, skew=0.0, steps=3)
    skewed = T.simulate_routing(n_experts=4, top_k=1, tokens=400, capacity_factor=1.0, skew=3.0, steps=3)
    assert all(sum(c) == 400 for c in even.counts) and even.kept == even.counts
    assert skewed.capacity == 100 and all(max(k) <= 100 for k in skewed.kept)
    assert T.imbalance(skewed.counts[0]) > T.imbalance(even.counts[0])
    assert T.load_entropy([5, 5, 5, 5]) == pytest.approx(1.0) and T.load_entropy([20, 0, 0, 0]) == 0.0


def test_routing_figure_and_dashboard():
    from playbook.viz.ep import bytes_figure, routing_figure
    from playbook.viz.ep_dashboard import routing_dashboard

    fig = routing_figure([[3, 1], [2, 2]], [[2, 1], [2, 2]], capacity=2)
    assert list(fig.data[0].z[0]) == [3, 1] and list(fig.data[1].y) == [0.25, 0.0]
    assert list(fig.data[2].y) == [1.5, 1.0]  # max/mean
    assert list(bytes_figure([10.0, 20.0], [10.0, 20.0]).data[1].y) == [10.0, 20.0]
    dash = routing_dashboard(n_experts=4, top_k=1, capacity_factor=1.0, skew=2.0)
    fig_widget = dash.children[-1]
    real = [[{"counts": [5, 3], "kept": [4, 3], "capacity": 4}], [{"counts": [4, 4], "kept": [4, 4], "capacity": 4}]]
    with_run = routing_dashboard(n_experts=4, top_k=1, last_run=real)
    assert [list(r) for r in with_run.children[-1].data[0].z] == [[5, 3], [4, 4]]
    before = [list(r) for r in fig_widget.data[0].z]
    dash.children[1].children[1].value = 0.0  # skew slider
    assert [list(r) for r in fig_widget.data[0].z] != before


def test_inference_weights_with_experts_split():
    ds = ModelConfig.preset("deepseek-v3")
    routed = 58 * 256 * 3 * 7168 * 2048  # 58 MoE layers of 256 routed experts
    assert T.inference_weight_bytes(ds, ep=64) == 2 * (ds.num_params() - routed + routed / 64)
    assert T.inference_weight_bytes(ds) == 2 * ds.num_params()


def test_the_moe_theory_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, playbook.theory.moe.moe; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def _three_steps_with_bias_balancing(recompute: str, hybrid: bool):
    """gpt-tiny-moe with aux-loss-free balancing (γ = 0.05, large enough to change routing within
    three steps): losses, biases and gradients of three forward + backward passes."""
    from playbook.parallel.hybrid.recompute import apply_recompute

    cfg = ModelConfig.preset("gpt-tiny-moe")
    model = build(cfg, seed=0, bias_rate=0.05)
    if hybrid:  # the hybrid's recomputation (``parallel.hybrid.recompute``: early stop inside the MoE layer)
        apply_recompute(model, recompute)
    else:
        model.set_recompute(recompute)
    task = TrainSetup(model="gpt-tiny-moe").task()
    out = []
    for step in range(3):
        tokens, targets = task.batch(step, 8, 32)
        model.zero_grad()
        _, loss = model(tokens, targets)
        loss.backward()
        biases = [layer.route_bias.clone() for layer in model.modules() if isinstance(layer, MoEMLP)]
        out.append((loss.detach(), biases, [p.grad.clone() for p in model.parameters()]))
    return out


@pytest.mark.parametrize("hybrid", [False, True], ids=["GPT.set_recompute", "hybrid.apply_recompute"])
def test_bias_balancing_under_full_recomputation_routes_the_replay_as_its_forward(hybrid):
    """The replay of a recomputed block routes with the biases its forward routed with, and does not
    update them again: the same losses, biases (updated once per forward) and gradients as without
    recomputation. Updating in the replay (the old bug) routed it differently: torch's CheckpointError."""
    plain, replayed = _three_steps_with_bias_balancing("none", hybrid), _three_steps_with_bias_balancing("full", hybrid)
    assert all(b.abs().sum() > 0 for b in plain[0][1])  # every forward moves the biases
    for (loss, biases, grads), (loss2, biases2, grads2) in zip(plain, replayed):
        assert torch.equal(loss, loss2) and all(torch.equal(a, b) for a, b in zip(biases, biases2))
        assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(grads, grads2))
