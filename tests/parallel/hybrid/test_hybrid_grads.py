"""The one gradient-reduction table (``parallel.grads``): every parameter's class, and the
mesh axes its gradient is summed over. Its classes on a real TP shard, and the layout the table
fixed: ZeRO with an MoE model under tp without sequence parallelism, whose router and experts see
1/tp of the tokens each and were reduced over dp alone (gradients 86% off the single process)."""

import pytest
from test_hybrid_moe import MOE, check

from playbook.dims import ParallelDims
from playbook.parallel import grads as G
from playbook.theory.hybrid.plan import Plan


def test_the_table_has_one_row_per_class_with_its_axes():
    rows = {r["parameter class"]: r["summed over"] for r in G.table()}
    assert rows == {
        "tensor-parallel shard": "dp×cp",
        "replicated, fed the full sequence": "dp×cp",
        "replicated, fed a sequence shard": "tp × dp×cp",
        "routed expert": "tp × expert replicas",
        "tied embedding": "first + last stage × dp×cp",
    }


def _classes(ctx, sequence_parallel):
    import torch.distributed as dist

    from playbook.model.gpt import build_moe
    from playbook.parallel.grads import classes
    from playbook.parallel.tp.model import TPGPT

    model = TPGPT(build_moe(MOE.config(), 0), dist.group.WORLD, sequence_parallel=sequence_parallel)
    return {name: c.name for name, c in classes(model, 2, sequence_parallel).items()}


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2 with SP"])
def test_a_tensor_parallel_moe_models_parameters_fall_in_their_class(ranks2, sp):
    got = ranks2.run(_classes, sp)[0]
    assert got["blocks.0.attn.q_proj.weight"] == got["tok_emb.weight"] == "tensor-parallel shard"
    norm = "replicated, fed a sequence shard" if sp else "replicated, fed the full sequence"
    assert got["blocks.0.attn_norm.weight"] == got["norm.weight"] == norm
    assert got["blocks.0.mlp.router.weight"] == "replicated, fed a sequence shard"  # tp splits the MoE tokens
    assert got["blocks.0.mlp.experts.0.up_proj.weight"] == "routed expert"


@pytest.mark.parametrize("zero", [1, 3], ids=["ZeRO-1", "ZeRO-3"])
def test_zero_sums_an_moe_layer_over_tp_without_sequence_parallelism(ranks4, zero):
    check(ranks4, MOE, Plan(ParallelDims(dp=2, tp=2), zero=zero))
