"""A mixture of experts under a split backward (ZB-H1, ZB-V, DualPipe-V; Qi et al. 2023,
arXiv:2401.10241), on real ranks: with shared experts (DeepSeekMoE, Dai et al. 2024,
arXiv:2401.06066) and with selective or full recomputation, what W keeps of each MoE block from B
until W is predicted to the byte (``theory.hybrid.moe.moe_block_w_bytes``): parity against the
single process that routes the same micro-batches, bytes per rank per step on every axis
measured == predicted, and every memory category measured == predicted on every rank. Then,
without ranks, a grid of the layouts the hybrid composes: no category of any rank's memory
prediction is None, for a dense or an MoE model, so a category can never again go unchecked."""

from dataclasses import dataclass
from itertools import product

import pytest

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.training import TrainSetup
from playbook.theory.hybrid.hybrid import memory_per_rank
from playbook.theory.hybrid.moe import moe_layers_in
from playbook.theory.pp.rank_params import chunk_ranges
from hybrid_matrix import MOE, check


@dataclass(frozen=True)
class Variant(TrainSetup):
    """A preset with ``n_shared_experts`` shared experts, ``n_dense_layers`` dense blocks first and
    ``n_layers`` blocks (None: the preset's); the single-process reference builds the same model."""

    shared: int | None = None
    dense: int | None = None
    layers: int | None = None

    def config(self) -> ModelConfig:
        cfg = super().config()
        changes = {"n_shared_experts": self.shared, "n_dense_layers": self.dense, "n_layers": self.layers}
        return cfg.replace(**{k: v for k, v in changes.items() if v is not None})


SHARED = Variant(model="gpt-tiny-moe", shared=1)
MODES = ("none", "selective", "full")
PP2 = ParallelDims(pp=2)
DP_PP_EP = ParallelDims(dp=2, pp=2, ep=2)

CASES = [(f"{mode} in pp2 zb-v", MOE, Plan(PP2, schedule="zb-v", microbatches=2, recompute=mode), 2) for mode in MODES]
CASES += [
    (f"{mode} in dp2×pp2×ep2 zb-h1", MOE, Plan(DP_PP_EP, schedule="zb-h1", microbatches=4, recompute=mode), 4)
    for mode in MODES
]
CASES += [
    (f"shared experts, {mode} in pp2 zb-v", SHARED, Plan(PP2, schedule="zb-v", microbatches=2, recompute=mode), 2)
    for mode in MODES
]
CASES += [
    (
        f"shared experts, {mode} in pp2 zb-h1 (m=8: a peak after B, W's part in it)",
        SHARED,
        Plan(PP2, schedule="zb-h1", microbatches=8, recompute=mode),
        2,
    )
    for mode in ("none", "selective")
]
CASES += [
    (
        "shared experts, full in dp2×pp2×ep2 zb-h1",
        SHARED,
        Plan(DP_PP_EP, schedule="zb-h1", microbatches=4, recompute="full"),
        4,
    ),
    (
        "shared experts, full dualpipe-v in pp2",
        SHARED,
        Plan(PP2, schedule="dualpipe-v", microbatches=4, recompute="full"),
        2,
    ),
    (
        "shared experts, full zb-v in tp2×pp2 (W's tensors from B's rerun beside the kept graph)",
        SHARED,
        Plan(ParallelDims(tp=2, pp=2), schedule="zb-v", microbatches=2, recompute="full"),
        4,
    ),
    (
        "a dense block first (DeepSeek-V3's first_k_dense) and a shared expert, full zb-h1 in tp2×pp2",
        Variant(model="gpt-tiny-moe", shared=1, dense=1, layers=3),
        Plan(ParallelDims(tp=2, pp=2), schedule="zb-h1", microbatches=4, recompute="full"),
        4,
    ),
    (
        "full zb-v in tp2×pp2 with SP",
        MOE,
        Plan(ParallelDims(tp=2, pp=2), schedule="zb-v", microbatches=2, recompute="full", sequence_parallel=True),
        4,
    ),
    (
        "DeepSeek-V3's shape with its shared expert: dp4×pp2×ep2, ZeRO-1, DualPipe-V, full recomputation",
        Variant(model="gpt-tiny-moe", shared=1, global_batch=16),
        Plan(ParallelDims(dp=4, pp=2, ep=2), zero=1, schedule="dualpipe-v", microbatches=4, recompute="full"),
        8,
    ),
    (
        "full zb-h1 in cp2×pp2 (the RoPE positions held while a forward graph is)",
        MOE,
        Plan(ParallelDims(cp=2, pp=2), schedule="zb-h1", microbatches=4, recompute="full"),
        4,
    ),
]


@pytest.mark.parametrize("name, setup, plan, world", CASES, ids=[c[0] for c in CASES])
def test_an_moe_stage_under_a_split_backward_is_predicted_to_the_byte(request, name, setup, plan, world):
    """Parity, bytes per axis, and every memory category, activations included, on every rank."""
    check(request.getfixturevalue(f"ranks{world}"), setup, plan)


# ---- no rank: every category of every composable layout is predicted ----------------------------
def even_routing(cfg: ModelConfig, dims: ParallelDims, plan: Plan, rank: int, seq_len: int, rows: int) -> list:
    """The first step's routing of ``rank``'s MoE forwards (m per MoE layer of its chunks), each data
    and tp rank sending its k·T slots as evenly as the E experts allow, dropless."""
    ranges = chunk_ranges(cfg, dims.pp, dims.coords(rank)["pp"], plan.played_schedule, plan.v)
    slots = cfg.top_k * (rows // plan.m) * seq_len // dims.cp // dims.tp  # k·T per data and tp rank
    row = [slots // cfg.n_experts + (e < slots % cfg.n_experts) for e in range(cfg.n_experts)]
    layer = {"counts_by_rank": [row] * (dims.dp * dims.cp * dims.tp), "capacity": None}
    return [layer] * (plan.m * moe_layers_in(cfg, ranges))


# Every preset our GPT can build (MLA, DeepSeek-V3's attention, is for counting only: ``playbook.model.gpt``),
# at most 4 blocks deep (which categories are predicted does not depend on depth; 4 keeps the grid fast)
GRID_MODELS = [
    Variant(model=name, layers=min(4, ModelConfig.preset(name).n_layers))
    for name in ModelConfig.presets()
    if ModelConfig.preset(name).attention == "gqa"
]
GRID_MODELS += [SHARED, Variant(model="gpt-tiny-moe", shared=2, dense=1, layers=3)]


@pytest.mark.parametrize("setup", GRID_MODELS, ids=lambda s: f"{s.model}, {s.config().n_shared_experts} shared")
def test_no_memory_category_is_left_unpredicted_in_any_composable_layout(setup):
    """Every layout of the grid that ``Plan.check`` accepts (``theory.hybrid.composition.refusal`` is None
    and the degrees divide): every rank's predicted memory has a number in every category. A branch
    that returns None for some case (as the split backward's MoE stage once did) turns this red."""
    cfg, seen = setup.config(), 0
    schedules = ("1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v")
    for dp, tp, pp, cp, ep, schedule, recompute, zero, sp in product(
        (1, 2), (1, 2), (1, 2), (1, 2), (1, 2) if cfg.is_moe else (1,), schedules, MODES, (0, 1), (False, True)
    ):
        if pp == 1 and schedule != "1f1b":
            continue
        try:
            dims = ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
            plan = Plan(dims, zero=zero, sequence_parallel=sp, schedule=schedule, microbatches=4, recompute=recompute)
            plan.check(setup)
        except ValueError:
            continue
        for rank in range(dims.world):
            routing = (
                even_routing(cfg, dims, plan, rank, setup.seq_len, setup.global_batch // dp) if cfg.is_moe else None
            )
            memory = memory_per_rank(
                cfg,
                dims,
                rank=rank,
                global_batch=setup.global_batch,
                seq_len=setup.seq_len,
                sequence_parallel=sp,
                schedule=plan.played_schedule,
                microbatches=plan.m,
                virtual_stages=plan.v,
                routing=routing,
                zero=zero,
                recompute=recompute,
            )
            unpredicted = [k for k, v in memory.items() if v is None]
            assert not unpredicted, (setup.model, plan, rank, unpredicted)
            seen += 1
    assert seen > 100, seen  # the grid is not empty: the check ran on many composable layouts
