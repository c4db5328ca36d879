"""Bytes per rank per step on each mesh axis, for a layout that combines strategies.

Each axis carries what one chapter derived, computed on this rank's *local* shapes:

- ``tp``: Megatron's two all-reduces per layer forward and two backward, or the sequence-parallel
  all-gather/reduce-scatter pairs, plus the vocab-parallel loss (``theory.tp.step_collectives``),
  for the layers of this rank's pipeline stage and this rank's rows;
- ``cp``: ring attention's K/V blocks and their gradients (``theory.cp.comm_bytes_per_layer``), of
  this rank's kv_heads/tp heads, for the layers of its stage;
- ``pp``: one activation [b/m, s/cp, h] ([b/m, s/(cp·tp), h] under SP) per forward send and one
  gradient per backward send, as many as this rank's list of the schedule has (``theory.schedules``);
- the data axis (``dp``, ``cp`` or ``dp×cp``, whichever holds replicated weights): one all-reduce of
  this rank's dense gradients (ring, 2S(n−1)/n), or ZeRO's reduce-scatters and all-gathers of its
  stage's dense flat units padded over dp×cp (Rajbhandari et al. 2019, §7; ``theory.hybrid_zero``),
  and expert parallelism's routing counts;
- ``ep``: the all-to-alls, from the routing counts of the run (``theory.moe``);
- ``ep_replica``: the expert gradients over the ranks that hold the same experts (under ZeRO: the
  reduce-scatter and all-gathers of the routed experts' own flat units).

Sizes in bytes (fp32). The loss reported to the user is not counted: it travels outside the step.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.comm import sent_bytes
from playbook.theory.hybrid_zero import flat_units, zero_comm, zero_memory
from playbook.theory.local_activations import stage_activation_bytes
from playbook.theory.moe import params_per_rank as moe_params
from playbook.theory.schedules import make_schedule
from playbook.theory.tp import step_collectives

FP32 = 4


def data_axis(dims: ParallelDims) -> str:
    """The name of the axis that holds replicated weights (dp, cp, or dp×cp; dp when neither splits)."""
    parts = [a for a in ("dp", "cp") if dims.size(a) > 1]
    return "×".join(parts) if len(parts) == 2 else (parts[0] if parts else "dp")


def stage_layers(cfg: ModelConfig, pp: int, stage: int) -> range:
    """The blocks of pipeline stage ``stage`` (``theory.stages.stage_layers``: equal when pp divides
    the layers, as the hybrid requires)."""
    from playbook.theory.stages import stage_layers as all_stage_layers

    return all_stage_layers(cfg.n_layers, pp)[stage]


def local_units(cfg: ModelConfig, dims: ParallelDims, stage: int = 0) -> list[tuple[str, int, int]]:
    """This rank's parameters by unit, as (name, split elements, replicated elements) under TP:
    the embedding (first stage), each block of the stage, the final norm and head (last stage).
    Split matrices hold 1/tp; norms are whole on every tensor-parallel rank."""
    t, h = dims.tp, cfg.hidden
    units = []
    if stage == 0:
        units.append(("embed", cfg.vocab_size * h // t, 0))
    for i in stage_layers(cfg, dims.pp, stage):
        units.append((f"block{i}", (cfg.layer_params() - 2 * h) // t, 2 * h))
    if stage == dims.pp - 1:
        units.append(("head", cfg.vocab_size * h // t, h))
    return units


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
    routing: list | None = None,
) -> dict[str, float]:
    """Bytes ``rank`` sends per training step on each axis of ``dims`` (see the module docstring).
    ``routing``: for expert parallelism, the routing stats of the run (``[step][layer]`` dicts with
    ``counts_by_rank`` and ``capacity``), from which the all-to-all bytes follow (mean per step)."""
    c = dims.coords(rank)
    stage, rows = c["pp"], global_batch // dims.dp
    out: dict[str, float] = {}

    def add(axis, value):
        if value:
            out[axis] = out.get(axis, 0.0) + float(value)

    if dims.tp > 1:
        layers = {f"layer{i}" for i in stage_layers(cfg, dims.pp, stage)}
        keep = layers | ({"embedding"} if stage == 0 else set()) | ({"head", "loss"} if stage == dims.pp - 1 else set())
        for col in step_collectives(
            cfg, seq_len=seq_len // dims.cp, micro_batch=rows, tp=dims.tp, sequence_parallel=sequence_parallel
        ):
            if col.region.split(".")[0] in keep:
                add("tp", col.sent_bytes)
        if sequence_parallel:  # the norms of this stage saw s/tp tokens each: their gradients summed over tp
            replicated = sum(rep for _, _, rep in local_units(cfg, dims, stage))
            add("tp", sent_bytes("all_reduce", FP32 * replicated, dims.tp))
    if dims.cp > 1:
        from playbook.theory.cp import comm_bytes_per_layer

        local = cfg.replace(n_heads=cfg.n_heads // dims.tp, n_kv_heads=cfg.kv_heads // dims.tp, head_dim=cfg.dim_head)
        per_layer = comm_bytes_per_layer(local, seq_len=seq_len, micro_batch=rows, cp=dims.cp, variant=cp_variant)
        add("cp", len(stage_layers(cfg, dims.pp, stage)) * sum(per_layer.values()))  # linear in rows: any m
    if dims.pp > 1:
        plan = make_schedule(schedule, dims.pp, microbatches)
        tokens = seq_len // dims.cp // (dims.tp if sequence_parallel else 1)  # this rank's share of a sequence
        message = FP32 * (rows // microbatches) * tokens * cfg.hidden  # [b/m, s/cp (/tp under SP), h]
        sends = [a for a in plan.actions[stage] if a.kind.startswith("send") and a.peer != stage]
        add("pp", len(sends) * message)
    n = dims.dp * dims.cp
    units = local_units(cfg, dims, stage)
    if cfg.is_moe and n > 1:  # the routing counts, all-gathered over the data ranks
        add(data_axis(dims), cfg.n_moe_layers * sent_bytes("all_gather", 8 * cfg.n_experts * n, n))
    if zero and n > 1:  # flat units, dense over dp×cp and routed experts over their replicas
        units_here = flat_units(cfg, dims, stage, stage_layers(cfg, dims.pp, stage))
        for axis, sent in zero_comm(units_here, zero, weight_gathers=1 if dims.pp > 1 else None).items():
            add(axis, sent)  # ZeRO-3 in a pipeline: gathered once a step (``parallel.zero_pipeline``)
    elif n > 1:
        dense = moe_params(cfg, dims.ep)["dense"] if cfg.is_moe else sum(split + rep for _, split, rep in units)
        add(data_axis(dims), sent_bytes("all_reduce", FP32 * dense, n))
    if cfg.is_moe and n > dims.ep and not zero:  # ep = 1: every rank holds every expert, its replicas are dp×cp
        p = moe_params(cfg, dims.ep)
        tensors = 3 * cfg.n_experts // dims.ep * cfg.n_moe_layers  # one "had a gradient" flag per tensor
        axis = "ep_replica" if dims.ep > 1 else data_axis(dims)
        add(axis, sent_bytes("all_reduce", FP32 * (p["experts"] + tensors), n // dims.ep))
    if routing is not None and dims.ep > 1:
        from playbook.theory.moe import alltoall_bytes_from_routing

        per_step = alltoall_bytes_from_routing(routing, dims.ep, cfg.hidden)  # [step][data rank]
        add("ep", sum(s[dims.data_index(rank)] for s in per_step) / len(per_step))
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
    routing: list | None = None,
    zero: int = 0,
) -> dict[str, float | None]:
    """Bytes ``rank`` holds by category in an fp32 AdamW run of our GPT (``zero``: ZeRO over dp×cp): its parameters
    (1/tp of every split matrix of its stage, norms whole; MoE: E/ep experts), as many gradient bytes,
    AdamW's two moments plus a 4-byte step per tensor, and the activations autograd saves at the
    step's peak (:func:`stage_activation_bytes`, any of dp, tp, cp, pp and SP together).
    A mixture of experts saves bytes that depend on the routing: give ``routing`` (the first step's
    ``[layer]`` stats) and ``theory.moe.model_activation_bytes_moe`` counts them; without it its
    activations are None."""
    c = dims.coords(rank)
    stage, rows = c["pp"], global_batch // dims.dp
    if cfg.is_moe:
        from playbook.theory.moe import param_tensors_per_rank

        numel, tensors = moe_params(cfg, dims.ep)["total"], param_tensors_per_rank(cfg, dims.ep)
        out: dict[str, float | None] = {
            "params": FP32 * numel,
            "grads": FP32 * numel,
            "optimizer": 2 * FP32 * numel + 4 * tensors,
            "activations": None,
        }
        if zero:
            out |= zero_memory(flat_units(cfg, dims, stage, stage_layers(cfg, dims.pp, stage)), zero)
        if routing is not None and dims.tp == dims.cp == dims.pp == 1:
            from playbook.theory.moe import model_activation_bytes_moe

            out["activations"] = model_activation_bytes_moe(
                cfg, seq_len=seq_len, micro_batch=rows, layers=routing, rank=dims.data_index(rank), ep=dims.ep
            )
        return out
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
    )
    units = local_units(cfg, dims, stage)
    if zero:
        return zero_memory(flat_units(cfg, dims, stage, stage_layers(cfg, dims.pp, stage)), zero) | {
            "activations": acts
        }
    numel = sum(split + rep for _, split, rep in units)
    tensors = sum(1 if name == "embed" else 2 if name == "head" else 9 for name, _, _ in units)
    return {
        "params": FP32 * numel,
        "grads": FP32 * numel,
        "optimizer": 2 * FP32 * numel + 4 * tensors,
        "activations": acts,
    }
