"""Expert parallelism on real ranks against the single-process MoE: parity, bytes, memory, errors."""

import contextlib
import functools
import io
import json

import pytest
import torch

from playbook.parallel.ep import model as E
from playbook.parallel.ep import run as R
from playbook.parallel.parity import assert_parity, floor_of
from playbook.parallel.report import failures
from playbook.parallel.training import TrainSetup
from playbook.theory.moe import moe as T
from router_bias import biased_router

SETUP = TrainSetup(model="gpt-tiny-moe", steps=3, global_batch=8, seq_len=32)
CFG = SETUP.config()
AUX = 1e-7  # the aux loss is ~1e-2: 1e-5 relative


@functools.lru_cache
def reference(capacity_factor):
    return E.train_moe(SETUP, CFG, capacity_factor=capacity_factor)


@functools.lru_cache
def floor(capacity_factor):
    """The float floor of the MoE reference with this capacity: float32 against float64."""
    exact = E.train_moe(SETUP, CFG, capacity_factor=capacity_factor, dtype=torch.float64)
    aux = E.parity(reference(capacity_factor), exact)["max_abs_aux_diff"]
    return floor_of(reference(capacity_factor), exact) | {"max_abs_aux_diff": aux}


def assert_moe_parity(p, capacity_factor):
    """Loss, gradients, parameters (relative L2 per tensor: Adam turns a near-zero gradient's rounding
    into a ~lr step in a few elements) and the aux loss, each within max(1e-5 relative, 3 x the floor)."""
    assert_parity(p, floor=floor(capacity_factor))
    assert p["max_abs_aux_diff"] <= max(AUX, 3 * floor(capacity_factor)["max_abs_aux_diff"]), p


def run(ranks, capacity_factor, mode="ep", ep=None):
    options = dict(capacity_factor=capacity_factor, ep=ep, experts_tp=mode == "tp")  # the preset itself: CFG
    results = ranks.run(R.on_rank, SETUP, **options, progress=False)
    return results, E.merge(results, mode)


@pytest.mark.parametrize("n,ep", [(2, 2), (4, 4), (4, 2)], ids=["ep2", "ep4", "ep2xdp2"])
@pytest.mark.parametrize("capacity_factor", [None, 1.0], ids=["no-drop", "drops"])
def test_ep_parity_bytes_and_memory(request, n, ep, capacity_factor):
    ranks = request.getfixturevalue(f"ranks{n}")
    results, whole = run(ranks, capacity_factor, ep=ep)
    ref = reference(capacity_factor)
    p = E.parity(whole, ref)
    assert_moe_parity(p, capacity_factor)
    assert p["same_experts_chosen"] and p["same_tokens_dropped"]
    assert set(whole.grads) == set(ref.grads) and set(whole.params) == set(ref.params)
    dropped = sum(L["dropped"] for step in ref.routing for L in step)
    assert (dropped > 0) == (capacity_factor is not None)
    assert E.replicas_agree(results) == 0.0  # replicated weights stay bit-identical
    # all-to-all bytes: predicted from the routing counts alone == measured by the tracer, every rank and step
    predicted = E.predicted_alltoall_bytes(whole, ep, CFG.hidden)
    measured = [[r.comm[s]["all_to_all_single"] for r in results] for s in range(SETUP.steps)]
    assert predicted == measured
    # memory of every rank: 1/ep of the experts, and the exact activation count from its routing
    state = T.moe_model_state_bytes(CFG, ep=ep, dp=n, precision="fp32", n_tensors=T.param_tensors_per_rank(CFG, ep))
    per_rank_params = 4 * (
        CFG.num_params() - 2 * 4 * 3 * 64 * 64 * (ep - 1) // ep
    )  # by hand: drop (ep-1)/ep of the experts
    for r, res in enumerate(results):
        assert res.memory["params"] == state.params == per_rank_params
        assert res.memory["optimizer"] == state.optimizer
        acts = T.model_activation_bytes_moe(
            CFG, seq_len=SETUP.seq_len, micro_batch=SETUP.global_batch // n, layers=whole.routing[0], rank=r, ep=ep
        )
        assert res.memory["activations"] == acts
        assert sum(1 for k in res.params if ".experts." in k) == 2 * 3 * 4 // ep


@pytest.mark.parametrize("n", [2, 4])
def test_tensor_parallel_experts_parity_and_bytes(request, n):
    ranks = request.getfixturevalue(f"ranks{n}")
    cf = 1.0 if n == 4 else None
    results, whole = run(ranks, cf, mode="tp")
    p = E.parity(whole, reference(cf))
    assert_moe_parity(p, cf)
    assert p["same_tokens_dropped"]
    tokens = SETUP.global_batch // n * SETUP.seq_len
    predicted = T.step_comm_bytes(CFG, n, n, "tp", tokens)
    for step in results[0].comm:
        assert {k: v for k, v in step.items() if k != "all_to_all_seconds"} == predicted
    # by hand: per MoE layer, gather + scatter forward, and again backward, of T_local * n * h fp32 rows
    assert predicted["all_gather_single"] == 2 * 2 * 4 * tokens * n * CFG.hidden * (n - 1) / n


def test_our_all_to_all_matches_pytorch_and_one_process(ranks4):
    def exchange(ctx):
        import torch.distributed as dist

        from playbook.parallel.comm import all_to_all

        send_all = [[(3 * s + d) % 4 for d in range(4)] for s in range(4)]  # uneven, some empty
        send = send_all[ctx.rank]
        recv = [send_all[s][ctx.rank] for s in range(4)]
        gen = torch.Generator().manual_seed(ctx.rank)
        x = torch.randn(sum(send), 5, generator=gen, requires_grad=True)
        weights = torch.randn(sum(recv), 5, generator=gen)
        out = {}
        for native in (False, True):
            y = all_to_all(x, send, recv, ctx.group, native=native)
            (g,) = torch.autograd.grad((y * weights).sum(), x)
            out[native] = (y.detach(), g)
        return x.detach(), weights, send, out, dist.get_world_size()

    res = ranks4.run(exchange, progress=False)
    for r, (x, w, send, out, _) in enumerate(res):
        assert torch.equal(out[False][0], out[True][0]) and torch.equal(out[False][1], out[True][1])
        # one process: rank r receives from each source s the block s addressed to r
        blocks = [res[s][0].split(res[s][2])[r] for s in range(4)]
        assert torch.equal(out[False][0], torch.cat(blocks))
        # gradient: the weights of every destination's slot come back to where the row came from
        back = torch.cat([res[d][1].split([res[s][2][d] for s in range(4)])[r] for d in range(4)])
        assert torch.equal(out[False][1], back)


def test_a_missing_division_of_expert_gradients_is_caught(ranks2):
    def wrong(ctx, setup, cfg):
        import playbook.parallel.ep.model as ep
        from playbook.model.moe import is_expert

        right = ep.sync_gradients

        def forgot_experts(model, mesh, **options):
            right(model, mesh, **options)
            for name, p in model.named_parameters():
                if is_expert(name) and p.grad is not None:
                    p.grad *= mesh.size("dp_cp")  # as if expert gradients were not divided by n

        ep.sync_gradients = forgot_experts
        try:
            return ep.train_moe(setup, cfg, ctx=ctx)
        finally:
            ep.sync_gradients = right

    whole = E.merge(ranks2.run(wrong, SETUP, CFG, progress=False))
    assert E.parity(whole, reference(None))["max_rel_grad_diff"] > 0.5


def test_bad_degrees_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"ep=3 does not divide n_experts=4.*try ep in \{1, 2, 4\}"):
        R.run_ep(SETUP, world_size=3, ep=3)
    with pytest.raises(ValueError, match=r"ep=4 does not divide dp=2"):
        E.validate(CFG.replace(n_experts=8), 2, 4, None, 8)
    with pytest.raises(ValueError, match="top_k=5 exceeds n_experts=4"):
        R.run_ep(SETUP, world_size=2, top_k=5)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        R.run_ep(SETUP, world_size=2, capacity_factor=0.0)
    with pytest.raises(ValueError, match="tp=3 does not divide expert_ffn_hidden=64"):
        E.validate(CFG, 3, 3, None, 6, mode="tp")


def test_cli_json_has_the_routing_block():
    from playbook.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert (
            main(
                [
                    "run",
                    "ep",
                    "--world-size",
                    "2",
                    "--experts",
                    "4",
                    "--top-k",
                    "1",
                    "--capacity-factor",
                    "1.0",
                    "--steps",
                    "2",
                    "--json",
                ]
            )
            == 0
        )
    report = json.loads(out.getvalue())
    assert report["strategy"] == "ep" and report["setup"]["top_k"] == 1
    assert not failures(report["parity"], report["parity"]["bounds"]) and report["parity"]["same_tokens_dropped"]
    assert report["native"]["max_rel_grad_diff"] == 0.0
    assert report["native"]["max_rel_l2_param_diff"] <= report["parity"]["bounds"]["max_rel_l2_param_diff"]
    assert report["memory"]["predicted"] == {k: float(v) for k, v in report["memory"]["measured"].items()}
    tokens = 8 * 32  # global batch x seq: every token picks one expert
    for step in report["routing"]["steps"]:
        assert step["alltoall_bytes_per_rank"]["predicted"] == step["alltoall_bytes_per_rank"]["measured"]
        for layer in step["layers"]:
            assert sum(layer["tokens_per_expert"]) == tokens and layer["capacity"] == 64  # ceil(256 / 4 * 1.0)
            assert sum(layer["kept_per_expert"]) == tokens - layer["dropped"] == sum(layer["load_per_rank"])
    assert report["comm"]["predicted"] == pytest.approx(report["comm"]["measured"], rel=1e-12)


# ---- an expert that receives no token ----------------------------------------------------------
@contextlib.contextmanager
def _silent_expert(silent: int):
    """While active, ``train_moe`` builds models whose routers score expert ``silent`` 1e4 lower (it
    never makes the top-k, on any rank), and every AdamW it creates is kept in ``seen``."""
    seen, real_adamw = {}, torch.optim.AdamW

    class Recorded(real_adamw):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["optimizer"] = self

    torch.optim.AdamW = Recorded
    try:
        with biased_router(E, "build", silent, -1e4, seen):
            yield seen
    finally:
        torch.optim.AdamW = real_adamw


def _optimizer_state(seen) -> dict[str, dict[str, torch.Tensor]]:
    state = seen["optimizer"].state
    return {
        name: {k: v.detach().clone() for k, v in state[p].items()}
        for name, p in seen["model"].named_parameters()
        if p in state
    }


def _train_with_a_silent_expert(ctx, setup, cfg, silent, ep_degree):
    with _silent_expert(silent) as seen:
        run = E.train_moe(setup, cfg, ctx=ctx, ep=ep_degree)
    return run, _optimizer_state(seen)


def test_an_expert_without_tokens_inside_ep_x_dp_matches_the_reference(ranks4):
    """EP = 2 inside DP = 4: expert 1 lives on ranks 0 and 2 (replicas) and gets no token anywhere.
    The single process leaves its gradient None, so AdamW neither moves it (no weight decay either)
    nor creates its state; EP must do the same, not all-reduce zeros into a gradient."""
    silent = 1
    with _silent_expert(silent) as seen:
        ref = E.train_moe(SETUP, CFG)
    with _silent_expert(silent):
        exact = E.train_moe(SETUP, CFG, dtype=torch.float64)
    ref_state = _optimizer_state(seen)
    answers = ranks4.run(_train_with_a_silent_expert, SETUP, CFG, silent, 2, progress=False)
    results, states = [a[0] for a in answers], [a[1] for a in answers]
    whole = E.merge(results)
    for run_ in (ref, whole):
        assert all(layer["counts"][silent] == 0 for step in run_.routing for layer in step)
    names = {k for k in ref.params if f".mlp.experts.{silent}." in k}
    assert len(names) == 2 * 3  # 2 MoE layers, gate/up/down
    assert names.isdisjoint(ref.grads) and names.isdisjoint(whole.grads)  # None, as in the reference
    assert names.isdisjoint(ref_state)
    assert_parity(E.parity(whole, ref), floor=floor_of(ref, exact))
    for name in names:  # never touched: still the initial weights, bit for bit
        initial = dict(E.build(CFG, SETUP.seed).named_parameters())[name]
        assert torch.equal(whole.params[name], initial.detach()) and torch.equal(ref.params[name], initial.detach())
    # optimizer state of every parameter, from the first rank that holds it, as in E.merge
    got: dict[str, dict[str, torch.Tensor]] = {}
    for st in states:
        got.update({k: v for k, v in st.items() if k not in got})
    assert set(got) == set(ref_state)  # the silent expert has no state on any rank
    for name, want in ref_state.items():
        assert float(got[name]["step"]) == float(want["step"]) == SETUP.steps
        for key in ("exp_avg", "exp_avg_sq"):
            w, g = want[key], got[name][key]
            assert (g - w).abs().max() <= 1e-4 * w.abs().max() + 1e-12, (name, key)


@pytest.mark.parametrize("k, n, ratio", [(2, 4, 0.5), (2, 8, 0.25), (8, 4, 2.0), (8, 8, 1.0)])
def test_chapter6_ep_over_tp_bytes_is_k_over_tp(k, n, ratio):
    # chapter 6: 4·k·T·h·(n−1)/n against 4·T·n·h·(n−1)/n; DeepSeek-V3's k = 8 sends as much or more
    from playbook.theory.moe import moe

    ep_bytes = 4 * moe.uniform_alltoall_bytes(16, k, n, 64)
    assert ep_bytes / moe.tp_experts_bytes_per_step(16, n, 64) == pytest.approx(ratio)
