"""Issue 31: near-misses in the numbers, each a realistic one-line bug no other green test sees.

- the hybrid's reported loss summed over dp only (or cp only) when cp > 1;
- a rank's expert-group coordinate that forgets cp (``dp % ep`` for ``(dp·cp + cp) % ep``);
- capacity offsets not clamped at zero: routing so uneven that the earlier data rank alone fills an
  expert leaves the later one a negative quota (wrong kept counts, negative all-to-all splits);
- a paged KV cache whose last, partial block is not counted (``context // block_size``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.dims import ParallelDims
from playbook.parallel.ep import model as E
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.parity import assert_parity, bounds, floor_of, reference
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup
from playbook.serve.kv import PagedKVCache
from playbook.theory.moe import moe as T
from playbook.theory.serving import serving
from router_bias import biased_router


# ---- the hybrid's reported loss, cp > 1 -----------------------------------------------------------
def test_the_hybrid_reports_the_global_batch_loss_when_cp_splits_the_sequence(ranks4):
    """dp2×cp2: each rank holds a quarter of the tokens and its share of the loss (Σ of its token
    losses / the global token count); the loss reported is the sum of all four shares (dp×cp).
    Summing over dp (or cp) alone halves it. Only the loss is gated here, so the check stays green
    on CPUs whose float32 gradients sit near the parity bound."""
    setup, plan = TrainSetup(steps=2), Plan(ParallelDims(dp=2, cp=2))
    plan.check(setup)
    ours = merge(ranks4.run(train_hybrid, setup, plan), plan.dims.tp)
    diff = compare(ours, reference(setup))["max_abs_loss_diff"]
    assert diff <= bounds(setup)["max_abs_loss_diff"], (ours.losses, reference(setup).losses)


# ---- the expert-group coordinate, cp > 1 ----------------------------------------------------------
LAYOUTS = [ParallelDims(dp=2, cp=2, ep=2), ParallelDims(dp=2, cp=2, ep=4), ParallelDims(dp=1, cp=4, ep=2, tp=2)]


@pytest.mark.parametrize("dims", LAYOUTS, ids=str)
def test_a_ranks_expert_coordinate_is_its_place_in_its_expert_group(dims):
    for r in range(dims.world):
        assert dims.coords(r)["ep"] == dims.ranks_along("ep", r).index(r), (dims, r)


def _ep_place(ctx, dims):
    mesh = ctx.mesh_for(dims)
    return {"coord": mesh.coords["ep"], "group_rank": dist.get_rank(mesh.group("ep"))}


def test_on_real_ranks_the_expert_coordinate_is_the_rank_in_the_ep_process_group(ranks4):
    for got in ranks4.run(_ep_place, LAYOUTS[0]):
        assert got["coord"] == got["group_rank"], got


# ---- capacity when the earlier data rank alone overflows an expert ---------------------------------
MOE = TrainSetup(model="gpt-tiny-moe", steps=2, global_batch=4, seq_len=16)
CROWDED = 0  # every token's first choice


def _train_crowded(ctx, setup, cfg, capacity_factor):
    with biased_router(E, "build", CROWDED, 1e4):  # every token of every rank picks it first
        return E.train_moe(setup, cfg, ctx=ctx, ep=2, capacity_factor=capacity_factor)


def test_an_expert_filled_by_the_first_data_rank_alone_keeps_nothing_from_the_second(ranks2):
    """32 tokens per rank, top-2 of 4 experts, capacity factor 0.5: capacity 16 slots per expert.
    Rank 0's 32 slots for the crowded expert fill it twice over; rank 1 keeps none of its own
    (clamp(16 − 32, 0, 32) = 0, not −16), and expert parallelism must still match one process."""
    cfg, factor = MOE.config(), 0.5
    answers = ranks2.run(_train_crowded, MOE, cfg, factor, progress=False)
    with biased_router(E, "build", CROWDED, 1e4):  # every token of every rank picks it first
        ref, exact = (
            E.train_moe(MOE, cfg, capacity_factor=factor),
            E.train_moe(MOE, cfg, capacity_factor=factor, dtype=torch.float64),
        )
    for layer in answers[0].routing[0]:
        by_rank, cap = layer["counts_by_rank"], layer["capacity"]
        assert by_rank[0][CROWDED] > cap  # the first rank alone overflows the expert
        assert layer["kept"] == [sum(col) for col in zip(*T.kept_counts(by_rank, cap))], layer
        assert layer["kept"][CROWDED] == cap
    whole = E.merge(answers)
    assert [[lay["kept"] for lay in s] for s in whole.routing] == [[lay["kept"] for lay in s] for s in ref.routing]
    assert_parity(E.parity(whole, ref), floor=floor_of(ref, exact))


# ---- a paged cache's partial last block -----------------------------------------------------------
@pytest.mark.parametrize("context", [20, 33, 47])
def test_a_partial_last_block_counts_whole_as_the_real_paged_cache_does(context):
    """gpt-tiny on a device with room for 10 blocks of 16 tokens after its weights: the sequences of
    ``context`` tokens (not a multiple of 16) that ``kv_capacity`` says fit are exactly those a real
    PagedKVCache of that many blocks admits before it is full."""
    cfg, block_size = ModelConfig.preset("gpt-tiny"), 16
    weights = serving.weights_per_gpu(cfg, dtype="fp32")
    block = block_size * serving.kv_bytes_per_token(cfg, dtype="fp32")
    act = serving.activation_peak(cfg, tokens=context, dtype="fp32")  # the profiling run's peak, also held
    room = weights + act + 10.5 * block
    hw = dataclasses.replace(Hardware.preset("h100-sxm"), memory_bytes=room, reported_memory_bytes=room)
    cap = serving.kv_capacity(cfg, hw, context=context, mem_util=1.0, block_size=block_size, dtype="fp32")
    cache = PagedKVCache(
        n_layers=cfg.n_layers,
        kv_heads=cfg.kv_heads,
        head_dim=cfg.dim_head,
        n_blocks=cap["blocks"],
        block_size=block_size,
    )
    assert cap["blocks"] == 10 and cache.block_bytes == cap["block_bytes"]
    admitted = 0
    with pytest.raises(RuntimeError, match="KV cache full"):
        while True:
            cache.add(admitted)
            cache.reserve(admitted, context)
            admitted += 1
    assert cap["max_seqs"] == admitted, (cap, admitted)
