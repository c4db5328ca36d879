"""Balancing a mixture of experts: aux-loss-free bias routing (on one process and on real ranks), the
capacity buffer's padded slots, the all-to-all across nodes, and chapter 6's table of trades."""

import itertools
import math

import pytest
import torch

from playbook.model.gpt import build_moe as build
from playbook.model.moe import configure, moe_layers, top_k_gating
from playbook.parallel.ep import model as E
from playbook.parallel.ep import run as R
from playbook.parallel.parity import assert_parity, floor_of
from playbook.parallel.registry import names
from playbook.parallel.training import TrainSetup
from playbook.theory.moe.capacity import imbalance
from playbook.theory.moe.routing import (
    capacity_buffer,
    cross_node_rows,
    ep_over_tp_bytes,
    node_limited_rows_sampled,
    nodes_reached,
)
from playbook.theory.cost.trades import STRATEGY_TRADES

SETUP = TrainSetup(model="gpt-tiny-moe", steps=3, global_batch=8, seq_len=32)
CFG = SETUP.config()


def test_the_bias_changes_the_choice_but_not_the_gates():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    experts, gates = top_k_gating(probs, 1, bias=torch.tensor([0.0, 0.0, 0.35]))
    # token 0: 0.5 vs 0.2 + 0.35 = 0.55 -> expert 2, gated by its own probability 0.2 (k = 1: not renormalised)
    assert experts.tolist() == [[2], [2]] and torch.allclose(gates, torch.tensor([[0.2], [0.3]]))
    experts, gates = top_k_gating(probs, 2, bias=torch.tensor([0.0, 0.0, 0.35]))
    assert experts.tolist() == [[2, 0], [2, 1]]
    assert torch.allclose(gates, torch.tensor([[0.2 / 0.7, 0.5 / 0.7], [0.3 / 0.9, 0.6 / 0.9]]))


def test_one_training_forward_moves_each_bias_by_gamma_toward_the_mean_load():
    model = build(CFG, seed=0, bias_rate=0.25)
    tokens, targets = SETUP.task().batch(0, SETUP.global_batch, SETUP.seq_len)
    model(tokens, targets)
    for layer in moe_layers(model):
        counts = layer.stats.counts  # the loads this forward routed
        mean = sum(counts) / len(counts)
        want = [0.25 * (1.0 if c < mean else -1.0 if c > mean else 0.0) for c in counts]
        assert layer.route_bias.tolist() == want
    with torch.no_grad():  # evaluation leaves the bias alone
        before = [layer.route_bias.clone() for layer in moe_layers(model)]
        model(tokens, targets)
    assert all(torch.equal(a, layer.route_bias) for a, layer in zip(before, moe_layers(model)))


def test_no_bias_rate_is_the_plain_router():
    tokens, targets = SETUP.task().batch(0, SETUP.global_batch, SETUP.seq_len)
    plain, zero = build(CFG, seed=0), build(CFG, seed=0, bias_rate=0.0)
    assert all(layer.route_bias is None for layer in moe_layers(zero))
    assert torch.equal(plain(tokens, targets)[1], zero(tokens, targets)[1])


@pytest.mark.parametrize("bad", [-0.1, math.inf, True, "0.01"])
def test_a_bad_bias_rate_is_one_clear_line(bad):
    with pytest.raises(ValueError, match="bias_rate must be a finite number >= 0"):
        configure(build(CFG), bias_rate=bad)


def test_bias_routing_on_real_ranks_equals_one_process(ranks2):
    """The bias is updated from the *global* counts, so every rank makes the same update and expert
    parallelism keeps choosing the experts one process chooses."""
    options = dict(capacity_factor=1.0, aux_alpha=0.0, bias_rate=0.05)
    results = ranks2.run(R.on_rank, SETUP, **options, progress=False)  # the MoE preset itself: CFG
    single = E.train_moe(SETUP, CFG, **options)
    p = E.parity(E.merge(results, "ep"), single)
    assert p["same_experts_chosen"] and p["same_tokens_dropped"], p
    assert_parity(p, floor=floor_of(single, E.train_moe(SETUP, CFG, **options, dtype=torch.float64)))


def _last_20_steps(ctx, long, cfg8):
    """Rank 0 trains with no balancing, rank 1 with the bias at γ = 0.001 (the two runs side by side,
    one core each); each returns (share of routed tokens dropped, mean imbalance) over the last 20 steps."""
    options = {"bias_rate": 0.001} if ctx.rank == 1 else {}
    run = E.train_moe(long, cfg8, capacity_factor=1.0, aux_alpha=0.0, **options)
    steps = run.routing[-20:]
    drop = sum(L["dropped"] for s in steps for L in s) / sum(sum(L["counts"]) for s in steps for L in s)
    return drop, sum(imbalance(L["counts"]) for s in steps for L in s) / sum(len(s) for s in steps)


def test_the_bias_balances_without_a_loss(ranks2):
    """DeepSeek-V3's γ = 0.001, no aux loss: after 60 steps fewer slots are over capacity and the load
    is more even than with no balancing at all (measured: 5.5% vs 13.0% dropped, imbalance 1.21 vs 1.58)."""
    long = TrainSetup(model="gpt-tiny-moe", steps=60, global_batch=16, seq_len=32)
    cfg8 = long.config().replace(n_experts=8, top_k=2)
    none, bias = ranks2.run(_last_20_steps, long, cfg8, progress=False)
    assert bias[0] < 0.7 * none[0] and bias[1] < none[1], (bias, none)


def test_capacity_buffer_by_hand():
    b = capacity_buffer([3, 1, 0, 4], 2, hidden=4, dtype_bytes=2)
    assert (b["filled"], b["padding"], b["dropped"]) == ([2, 1, 0, 2], [0, 1, 2, 0], [1, 0, 0, 2])
    assert b["buffer_bytes"] == 4 * 2 * 4 * 2 and b["filled_bytes"] == 5 * 4 * 2
    with pytest.raises(ValueError, match="counts must be >= 0"):
        capacity_buffer([1, -1], 2, hidden=4)


def _brute_force_nodes(n_experts, top_k, nodes):
    e = n_experts // nodes
    hits = [len({x // e for x in combo}) for combo in itertools.combinations(range(n_experts), top_k)]
    return [hits.count(d) / len(hits) for d in range(nodes + 1)]


@pytest.mark.parametrize("E_,k,N", [(8, 3, 4), (12, 4, 3), (16, 2, 8), (6, 6, 2)])
def test_nodes_reached_equals_enumeration(E_, k, N):
    assert nodes_reached(E_, k, N) == pytest.approx(_brute_force_nodes(E_, k, N), abs=1e-12)


def test_cross_node_rows():
    E_, k, N = 12, 4, 3
    p = _brute_force_nodes(E_, k, N)
    rows = cross_node_rows(E_, k, N, node_limit=2)
    assert rows["per_expert"] == pytest.approx(k * (N - 1) / N)
    assert rows["per_node"] == pytest.approx(sum(d * q for d, q in enumerate(p)) * (N - 1) / N)
    assert rows["node_limited"] == pytest.approx(sum(min(d, 2) * q for d, q in enumerate(p)) * (N - 1) / N)
    assert rows["node_limited"] < rows["per_node"] < rows["per_expert"]
    assert cross_node_rows(E_, k, N)["node_limited"] == rows["per_node"]  # no cap
    with pytest.raises(ValueError, match="node_limit"):
        cross_node_rows(E_, k + 1, N, node_limit=1)  # one node's 4 experts cannot hold top-5
    with pytest.raises(ValueError, match="node_limit"):
        cross_node_rows(E_, k, N, node_limit=0)
    # DeepSeek-V3: 256 experts, top-8, 8 nodes, at most 4 nodes per token
    ds = cross_node_rows(256, 8, 8, node_limit=4)
    assert ds["per_expert"] == 7.0 and 4.5 < ds["per_node"] < 4.8 and 3.4 < ds["node_limited"] < 3.5


def test_ep_over_tp_once_per_expert_or_once_per_rank():
    from playbook.theory.moe.comm import tp_experts_bytes_per_step, uniform_alltoall_bytes

    # chapter 6: DeepSeek-V3's top-8 of 256 experts at ep = tp = 4 and 8
    for n, per_rank in ((4, 0.90), (8, 0.66)):
        per_expert = ep_over_tp_bytes(256, 8, n)
        assert per_expert == pytest.approx(4 * uniform_alltoall_bytes(1, 8, n, 1) / tp_experts_bytes_per_step(1, n, 1))
        assert per_expert == 8 / n  # 2.0 and 1.0: "twice as much on 4 ranks" counts every (token, expert)
        # once per destination rank: E[D]/n, D the distinct ranks of the 8 experts
        got = ep_over_tp_bytes(256, 8, n, once_per="rank")
        expected_d = sum(d * q for d, q in enumerate(nodes_reached(256, 8, n)))
        assert got == pytest.approx(expected_d / n) and round(got, 2) == per_rank
    with pytest.raises(ValueError, match="once_per"):
        ep_over_tp_bytes(256, 8, 4, once_per="node")


def test_node_limited_routing_sampled_as_deepseek_v3_routes():
    # nodes by the sum of their k/M best scores, then top-k inside: slightly below the E[min(D, M)] cap
    bound = cross_node_rows(256, 8, 8, node_limit=4)["node_limited"]
    uniform = node_limited_rows_sampled(256, 8, 8, 4)
    sigmoid = node_limited_rows_sampled(256, 8, 8, 4, scores="sigmoid")
    assert round(bound, 2) == 3.49 and round(uniform, 2) == 3.46 and round(sigmoid, 2) == 3.47
    assert uniform < sigmoid < bound
    assert node_limited_rows_sampled(256, 8, 8, 4) == uniform  # seeded
    assert node_limited_rows_sampled(8, 2, 2, 1, tokens=500) == 0.5  # one node: D = 1, half of it remote
    with pytest.raises(ValueError, match=r"node_limit \| top_k"):
        node_limited_rows_sampled(256, 8, 8, 3)


def test_the_trade_table_covers_every_training_strategy():
    covered = {name.strip() for row in STRATEGY_TRADES for name in row["runs"].split(",")}
    assert covered == set(names()) - {"single", "serve", "hybrid"}
    assert all(set(row) == set(STRATEGY_TRADES[0]) and all(row.values()) for row in STRATEGY_TRADES)


def test_the_trade_table_uses_one_n_for_every_degree():
    # n is the degree in every row (chapter 5's c is the tokens per rank, s/n); TP can be overlapped
    rows = {row["runs"]: row for row in STRATEGY_TRADES}
    assert "(n−1) steps" in rows["cp"]["communicates"] and "s/n" in rows["cp"]["link"]
    assert not any("(c−1)" in v or "s/c" in v for row in STRATEGY_TRADES for v in row.values())
    assert "overlap" in rows["tp"]["link"] and "not overlapped" not in rows["tp"]["link"]
    assert "once per destination rank" in rows["ep"]["communicates"]


def test_the_balance_figures_draw_what_they_are_given():
    from playbook.viz.moe_balance import balance_figure, capacity_figure

    fig = capacity_figure(capacity_buffer([5, 1, 3], 3, hidden=4))
    assert [list(t.y) for t in fig.data] == [[3, 1, 3], [0, 2, 0], [2, 0, 0]]  # filled, padding, dropped
    step = [{"router_entropy": math.log(4) / 2, "dropped": 1, "counts": [3, 1, 0, 0]}]
    fig = balance_figure({"run": [step, step]}, n_experts=4)
    assert list(fig.data[0].y) == [0.5, 0.5] and list(fig.data[1].y) == [0.25, 0.25]
