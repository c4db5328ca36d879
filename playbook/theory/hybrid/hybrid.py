"""Bytes per rank per step on each mesh axis, for a layout that combines strategies.

Each axis carries what one chapter derived, computed on this rank's *local* shapes:

- ``tp``: Megatron's two all-reduces per layer forward and two backward, or the sequence-parallel
  all-gather/reduce-scatter pairs, plus the vocab-parallel loss (``theory.tp.tp.step_collectives``),
  for the layers of this rank's pipeline chunks (``chunk_ranges``: v virtual stages) and its rows;
  with SP and a split backward (ZB-H1, ZB-V, DualPipe-V) W replays each row-parallel exit's all-gather;
- ``cp``: ring attention's K/V blocks and their gradients (``theory.cp.comm_bytes_per_layer``), of
  this rank's kv_heads/tp heads, for the layers of its stage;
- ``pp``: one activation [b/m, s/cp, h] ([b/m, s/(cp·tp), h] under SP) per forward send and one
  gradient per backward send, as many as this rank's list of the schedule has (``theory.pp.schedules``);
- the data axis (``dp``, ``cp`` or ``dp×cp``, whichever holds replicated weights): one all-reduce of
  this rank's dense gradients (ring, 2S(n−1)/n), or ZeRO's reduce-scatters and all-gathers of its
  stage's dense flat units padded over dp×cp (Rajbhandari et al. 2019, §7; ``theory.hybrid.zero``),
  and expert parallelism's routing counts;
- ``ep``: the all-to-alls, from the routing counts of the run (``theory.moe.moe``);
- ``ep_replica``: the expert gradients over the ranks that hold the same experts (under ZeRO: the
  reduce-scatter and all-gathers of the routed experts' own flat units);
- ``embed``: a tied embedding's gradient, summed over its first and last pipeline rank (Megatron's
  embedding group, Narayanan et al. 2021), one all-reduce of [vocab/tp, hidden] over 2 ranks.

A mixture of experts (``theory.hybrid.moe``): its stage's parameters, its routing counts per
forward (over tp, then dp×cp), its MoE layers' tp traffic (no TP region in the MLP: the tokens are
split over tp instead) and its activations, micro-batch by micro-batch from the run's routing.

With activation recomputation (``recompute``) the recomputed forward sends again what it sent:
TP's collectives up to each block's MLP input under "full" (``theory.tp.tp``, phase "recompute") and
CP's forward exchange once more per layer under either mode, and under "full" an MoE layer's
routing counts and all-to-alls (``theory.hybrid.recompute``).

Sizes in bytes (fp32). The loss reported to the user is not counted: it travels outside the step.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.cost.comm import sent_bytes
from playbook.theory.cp import comm_bytes_per_layer
from playbook.theory.hybrid.moe import data_axis_bytes, for_tp_rank, moe_layers_in, replica_axis
from playbook.theory.hybrid.moe import tp_axis_bytes as moe_tp_bytes
from playbook.theory.hybrid.moe import stage_activation_bytes as moe_stage_activations
from playbook.theory.hybrid.recompute import cp_replay_bytes_per_layer, local_heads, moe_replay_bytes
from playbook.theory.hybrid.zero import data_axis, flat_units, zero_comm, zero_memory
from playbook.theory.hybrid.local_activations import stage_activation_bytes
from playbook.theory.moe.comm import alltoall_bytes_from_routing
from playbook.theory.pp.rank_params import blocks_in, chunk_ranges, rank_units
from playbook.theory.pp.schedules import is_split, make_schedule
from playbook.theory.tp.comm import step_collectives

FP32 = 4


def tied_stage_ranks(cfg: ModelConfig, pp: int, schedule: str = "1f1b", v: int = 1) -> tuple[int, int]:
    """The pipeline ranks holding the embedding (piece 0) and the head (piece L + 1): (0, pp − 1),
    or (0, 0) on the V, whose rank 0 holds the first and the last stage."""
    holds = [{i for a, b in chunk_ranges(cfg, pp, r, schedule, v) for i in range(a, b)} for r in range(pp)]
    return next(r for r in range(pp) if 0 in holds[r]), next(r for r in range(pp) if cfg.n_layers + 1 in holds[r])


def comm_per_axis(
    cfg: ModelConfig,
    dims: ParallelDims,
    *,
    rank: int,
    global_batch: int,
    seq_len: int,
    zero: int = 0,
    sequence_parallel: bool = False,
    cp_variant: str = "ring",
    schedule: str = "1f1b",
    microbatches: int = 1,
    virtual_stages: int = 1,
    routing: list | None = None,
    recompute: str = "none",
    max_norm: float | None = None,
) -> dict[str, float]:
    """Bytes ``rank`` sends per training step on each axis of ``dims`` (see the module docstring).
    ``routing``: for expert parallelism, the routing stats of the run (``[step][layer]`` dicts with
    ``counts_by_rank`` and ``capacity``), from which the all-to-all bytes follow (mean per step).
    ``max_norm``: clipping by the global norm, one fp32 all-reduce over the world (``parallel.clip``)."""
    c = dims.coords(rank)
    stage, rows = c["pp"], global_batch // dims.dp
    ranges = chunk_ranges(cfg, dims.pp, stage, schedule, virtual_stages)
    pieces, blocks = {i for start, end in ranges for i in range(start, end)}, blocks_in(cfg, ranges)
    units = rank_units(cfg, dims, ranges)
    out: dict[str, float] = {}

    def add(axis, value):
        if value:
            out[axis] = out.get(axis, 0.0) + float(value)

    if dims.tp > 1:
        keep = {f"layer{i}" for i in blocks} | ({"embedding"} if 0 in pieces else set())
        keep |= {"head", "loss"} if cfg.n_layers + 1 in pieces else set()
        moe_mlps = {f"layer{i}.mlp" for i in range(cfg.n_dense_layers, cfg.n_layers)} if cfg.is_moe else set()
        for col in step_collectives(
            cfg,
            seq_len=seq_len // dims.cp,
            micro_batch=rows,
            tp=dims.tp,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
        ):
            if col.region.split(".")[0] in keep and col.region not in moe_mlps:  # MoE: no TP region in the MLP
                add("tp", col.sent_bytes)
        if cfg.is_moe:
            sizes = dict(rows=rows, seq_len=seq_len, sequence_parallel=sequence_parallel)
            add("tp", moe_tp_bytes(cfg, dims, stage, microbatches=microbatches, flags=not zero, ranges=ranges, **sizes))
        if sequence_parallel:  # the norms of this stage saw s/tp tokens each: their gradients summed over tp
            add("tp", sent_bytes("all_reduce", FP32 * sum(u.norms for u in units), dims.tp))
        if sequence_parallel and dims.pp > 1 and is_split(schedule):  # W replays each row-parallel exit's
            # backward (``pp.executor``: autograd.grad of the module's output, one node deep): under SP the
            # reduce-scatter's all-gather again, o_proj and down_proj (an MoE block: o_proj alone, its
            # experts are whole), per block and micro-batch
            exit_grad = FP32 * (rows // microbatches) * (seq_len // dims.cp) * cfg.hidden  # [b/m, s/cp, h]
            exits = 2 * len(blocks) - moe_layers_in(cfg, ranges)
            add("tp", exits * microbatches * sent_bytes("all_gather", exit_grad, dims.tp))
    if dims.cp > 1:
        per_layer = comm_bytes_per_layer(
            local_heads(cfg, dims.tp), seq_len=seq_len, micro_batch=rows, cp=dims.cp, variant=cp_variant
        )
        add("cp", len(blocks) * sum(per_layer.values()))  # linear in rows: any m
        sizes = dict(seq_len=seq_len, micro_batch=rows, variant=cp_variant, recompute=recompute)
        add("cp", len(blocks) * cp_replay_bytes_per_layer(cfg, dims, **sizes))  # the core reruns in backward
    if dims.pp > 1:
        plan = make_schedule(schedule, dims.pp, microbatches, virtual_stages)
        tokens = seq_len // dims.cp // (dims.tp if sequence_parallel else 1)  # this rank's share of a sequence
        message = FP32 * (rows // microbatches) * tokens * cfg.hidden  # [b/m, s/cp (/tp under SP), h]
        sends = [a for a in plan.actions[stage] if a.kind.startswith("send") and a.peer != stage]
        add("pp", len(sends) * message)
    n = dims.dp * dims.cp
    mb = microbatches  # pp = 1 too: its m micro-batches are gradient accumulation
    if zero and n > 1:  # flat units, dense over dp×cp and routed experts over their replicas
        gathers = 1 if dims.pp > 1 or microbatches > 1 else None  # ZeRO-3 over micro-batches: gathered once a step
        for axis, sent in zero_comm(flat_units(cfg, dims, ranges), zero, weight_gathers=gathers).items():
            add(replica_axis(dims, rank, data_axis(dims)) if axis == "ep_replica" else axis, sent)
        if cfg.is_moe:  # the routing counts still travel over the data ranks
            add(data_axis(dims), data_axis_bytes(cfg, dims, stage, mb, dense=False, ranges=ranges)["data"])
    elif cfg.is_moe:  # routing counts and dense gradients over dp×cp
        add(data_axis(dims), data_axis_bytes(cfg, dims, stage, mb, ranges=ranges)["data"])
    elif n > 1:
        add(data_axis(dims), sent_bytes("all_reduce", FP32 * sum(u.numel for u in units), n))
    first, last = tied_stage_ranks(cfg, dims.pp, schedule, virtual_stages) if cfg.tie_embeddings else (0, 0)
    if first != last and stage in (first, last):  # the embedding group's sum of the two copies' gradients
        add("embed", sent_bytes("all_reduce", FP32 * cfg.vocab_size * cfg.hidden // dims.tp, 2))
    if cfg.is_moe and not zero:  # the experts over their replicas (ep = 1: every rank holds every expert)
        add(replica_axis(dims, rank, data_axis(dims)), data_axis_bytes(cfg, dims, stage, 1, ranges=ranges)["replica"])
    alltoall = 0.0
    if routing is not None and dims.ep > 1 and any(routing):  # a rank without MoE layers sends none
        mine = [for_tp_rank(step, dims, rank) for step in routing]  # this tp index's ep ranks
        per_step = alltoall_bytes_from_routing(mine, dims.ep, cfg.hidden)  # [step][data rank]
        alltoall = sum(s[dims.data_index(rank)] for s in per_step) / len(per_step)
        add("ep", alltoall)
    if cfg.is_moe:  # "full": each MoE layer's forward reruns in backward (``theory.hybrid.recompute``)
        forwards = microbatches * moe_layers_in(cfg, ranges)
        for axis, sent in moe_replay_bytes(
            cfg, dims, forwards=forwards, alltoall=alltoall, recompute=recompute
        ).items():
            add(data_axis(dims) if axis == "data" else axis, sent)
    if max_norm is not None:  # the partial sums of squares, one scalar over every rank
        add("norm", sent_bytes("all_reduce", FP32, dims.world))
    return out


# ---- memory per rank ---------------------------------------------------------------------------
def memory_per_rank(
    cfg: ModelConfig,
    dims: ParallelDims,
    *,
    rank: int,
    global_batch: int,
    seq_len: int,
    sequence_parallel: bool = False,
    cp_variant: str = "ring",
    schedule: str = "1f1b",
    microbatches: int = 1,
    virtual_stages: int = 1,
    routing: list | None = None,
    zero: int = 0,
    recompute: str = "none",
) -> dict[str, float | None]:
    """Bytes ``rank`` holds by category in an fp32 AdamW run of our GPT (``zero``: ZeRO over dp×cp): its parameters
    (1/tp of every split matrix of its stage, norms whole; MoE: E/ep experts), as many gradient bytes,
    AdamW's two moments plus a 4-byte step per tensor, and the activations autograd saves at the
    step's peak (:func:`stage_activation_bytes`, any of dp, tp, cp, pp and SP together).
    A mixture of experts saves bytes that depend on the routing: give ``routing`` (the first step's
    ``[forward]`` stats of this rank's MoE layers) and ``theory.hybrid.moe`` counts them, micro-batch
    by micro-batch; without it its activations are None."""
    c = dims.coords(rank)
    stage, rows = c["pp"], global_batch // dims.dp
    ranges = chunk_ranges(cfg, dims.pp, stage, schedule, virtual_stages)
    units = rank_units(cfg, dims, ranges)
    if zero:
        state = zero_memory(flat_units(cfg, dims, ranges), zero)
    else:
        numel = sum(u.numel for u in units)
        tensors = sum(u.tensors for u in units)
        state = {"params": FP32 * numel, "grads": FP32 * numel, "optimizer": 2 * FP32 * numel + 4 * tensors}
    if cfg.is_moe:
        acts = None
        if routing is not None:
            sizes = dict(rows=rows, seq_len=seq_len, schedule=schedule, microbatches=microbatches)
            layout = dict(sequence_parallel=sequence_parallel, cp_variant=cp_variant, recompute=recompute)
            layout |= dict(virtual_stages=virtual_stages)
            acts = moe_stage_activations(cfg, dims, stage, rank=rank, forwards=routing, **sizes, **layout)
        return {**state, "activations": acts}
    acts = stage_activation_bytes(
        cfg,
        dims,
        stage,
        rows=rows,
        seq_len=seq_len,
        schedule=schedule,
        microbatches=microbatches,
        sequence_parallel=sequence_parallel,
        cp_variant=cp_variant,
        virtual_stages=virtual_stages,
        recompute=recompute,
    )
    return {**state, "activations": acts}
