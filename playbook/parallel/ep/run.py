"""``playbook run ep``: expert parallelism on real ranks against the single process, the native
all-to-all beside ours, routing and all-to-all bytes in the report. Training, merging and parity
are ``playbook.parallel.ep.model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


from playbook.cluster import default_backend, launch
from playbook.config import ModelConfig, require_positive
from playbook.model.moe import AUX_ALPHA
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, max_rel_diff, rel_l2_diff
from playbook.parallel.training import TrainSetup
from playbook.theory.moe.moe import model_activation_bytes_moe, moe_model_state_bytes, param_tensors_per_rank
from playbook.theory.moe.comm import routing_report
from playbook.theory.moe.moe import step_comm_bytes as predicted_comm  # the chapter calls it by this name
from playbook.parallel.ep.model import merge, parity, predicted_alltoall_bytes, replicas_agree, train_moe, validate
from playbook.parallel.parity import floor_of, gated


# ---- playbook run ep ----------------------------------------------------------------------------
def moe_config(setup: TrainSetup, experts: int | None, top_k: int | None) -> ModelConfig:
    """The setup's preset as an MoE: a dense preset ``X`` becomes ``X-moe`` if that exists, else
    gets experts of width ffn_hidden // top_k; ``experts``/``top_k`` override."""
    require_positive(**{k: v for k, v in (("experts", experts), ("top_k", top_k)) if v is not None})
    cfg = setup.config()
    if not cfg.is_moe:
        try:
            cfg = ModelConfig.preset(f"{setup.model}-moe")
        except ValueError:
            k = 2 if top_k is None else top_k
            cfg = cfg.replace(
                n_experts=4 if experts is None else experts,
                top_k=k,
                expert_ffn_hidden=max(1, cfg.ffn_hidden // max(k, 1)),
            )
    if experts is not None or top_k is not None:  # 0 is a value to refuse, not "use the preset's"
        cfg = cfg.replace(
            n_experts=cfg.n_experts if experts is None else experts, top_k=cfg.top_k if top_k is None else top_k
        )
    return cfg


def layout(world_size: int, ep: int | None, experts_tp: bool) -> tuple[str, int]:
    """(mode, ep) of a run: experts over ``ep`` ranks (default all), or tensor-parallel experts."""
    return ("tp", world_size) if experts_tp else ("ep", world_size if ep is None else ep)


def on_rank(
    ctx,
    setup: TrainSetup,
    *,
    experts: int | None = None,
    top_k: int | None = None,
    capacity_factor: float | None = None,
    aux_alpha: float = AUX_ALPHA,
    ep: int | None = None,
    experts_tp: bool = False,
    native: bool = False,
    bias_rate: float = 0.0,
):
    """Rank function: ``train_moe`` of the setup's preset as an MoE (``moe_config``) on this rank;
    with ``native``, a pair: ours, then the same run with PyTorch's differentiable all-to-all."""
    cfg = moe_config(setup, experts, top_k)
    mode, ep = layout(ctx.world_size, ep, experts_tp)
    kw = dict(capacity_factor=capacity_factor, aux_alpha=aux_alpha, bias_rate=bias_rate, ctx=ctx, mode=mode, ep=ep)
    ours = train_moe(setup, cfg, **kw)
    if not native:
        return ours
    return ours, train_moe(setup, cfg, **kw, native=True)


def add_arguments(p) -> None:
    p.add_argument("--experts", type=int, default=None, help="number of experts (default: the preset's)")
    p.add_argument("--top-k", type=int, default=None, help="experts per token (default: the preset's)")
    p.add_argument("--capacity-factor", type=float, default=None, help="Switch capacity factor; default: no dropping")
    p.add_argument(
        "--ep", type=int, default=None, help="expert-parallel degree (divides world size); default: world size"
    )
    p.add_argument(
        "--aux-alpha", type=float, default=AUX_ALPHA, help="weight of the load-balancing loss (Switch: 0.01)"
    )
    p.add_argument("--experts-tp", action="store_true", help="contrast: tensor parallelism inside each expert instead")


@dataclass
class EPReport(RunReport):
    """:class:`RunReport` plus ``routing``: per step and layer, tokens per expert, drops, balance,
    and all-to-all bytes per rank predicted from the counts beside those measured."""

    routing: dict = field(default_factory=dict)

    def summary(self) -> str:
        lines = [
            super().summary(),
            "  routing (step: tokens per expert per layer; dropped; all-to-all bytes rank 0 pred/meas)",
        ]
        for s, step in enumerate(self.routing.get("steps", [])):
            per_layer = " | ".join(str(L["tokens_per_expert"]) for L in step["layers"])
            dropped = sum(L["dropped"] for L in step["layers"])
            b = step["alltoall_bytes_per_rank"]
            lines.append(f"    {s}: {per_layer}; dropped {dropped}; {b['predicted'][0]:,.0f} / {b['measured'][0]:,.0f}")
        return "\n".join(lines)


@register(
    "ep",
    help="expert parallelism: MoE experts split over ranks, tokens sent by all-to-all",
    arguments=add_arguments,
    on_rank=on_rank,
)
def run_ep(
    setup: TrainSetup,
    *,
    world_size: int,
    backend: str = "auto",
    launch=launch,
    experts: int | None = None,
    top_k: int | None = None,
    capacity_factor: float | None = None,
    ep: int | None = None,
    aux_alpha: float = AUX_ALPHA,
    experts_tp: bool = False,
) -> EPReport:
    cfg = moe_config(setup, experts, top_k)
    mode, degree = layout(world_size, ep, experts_tp)
    validate(cfg, world_size, degree, capacity_factor, setup.global_batch, mode)
    backend = default_backend(world_size) if backend == "auto" else backend
    both = launch(
        on_rank,
        world_size,
        setup,
        experts=experts,
        top_k=top_k,
        capacity_factor=capacity_factor,
        aux_alpha=aux_alpha,
        ep=ep,
        experts_tp=experts_tp,
        native=mode == "ep",
        backend=backend,
    )
    results = [b[0] for b in both] if mode == "ep" else both
    reference = train_moe(setup, cfg, capacity_factor=capacity_factor, aux_alpha=aux_alpha)
    exact = train_moe(setup, cfg, capacity_factor=capacity_factor, aux_alpha=aux_alpha, dtype=torch.float64)
    whole = merge(results, mode)
    native = None
    if mode == "ep":
        theirs = merge([b[1] for b in both], mode)
        native = {
            "reference": "torch functional all_to_all_single_autograd in place of ours",
            "max_rel_grad_diff": max_rel_diff(theirs.grads, whole.grads),
            "max_rel_param_diff": max_rel_diff(theirs.params, whole.params),
            "max_rel_l2_param_diff": rel_l2_diff(theirs.params, whole.params),
        }
    tokens = setup.global_batch // world_size * setup.seq_len
    measured_a2a = [[r.comm[s].get("all_to_all_single", 0.0) for r in results] for s in range(setup.steps)]
    seconds = [[r.comm[s]["all_to_all_seconds"] for r in results] for s in range(setup.steps)]
    split = dict(ep=degree, expert_tp=1) if mode == "ep" else dict(ep=1, expert_tp=world_size)
    state = moe_model_state_bytes(
        cfg, **split, dp=world_size, precision="fp32", n_tensors=param_tensors_per_rank(cfg, split["ep"])
    )
    acts = model_activation_bytes_moe(
        cfg,
        seq_len=setup.seq_len,
        micro_batch=setup.global_batch // world_size,
        layers=whole.routing[0],
        rank=0,
        ep=degree,
        mode=mode,
        tp=world_size,
    )
    predicted = {"params": state.params, "grads": state.grads, "optimizer": state.optimizer, "activations": float(acts)}
    comm_pred = predicted_comm(cfg, world_size, degree, mode, tokens)
    if mode == "ep":
        comm_pred["all_to_all_single"] = (
            sum(predicted_alltoall_bytes(whole, degree, cfg.hidden)[s][0] for s in range(setup.steps)) / setup.steps
        )
    comm_meas: dict[str, float] = {}
    for step in results[0].comm:
        for k, v in step.items():
            if k != "all_to_all_seconds":
                comm_meas[k] = comm_meas.get(k, 0.0) + v / setup.steps
    return EPReport(
        strategy="ep" if mode == "ep" else "ep (tensor-parallel experts)",
        world_size=world_size,
        backend=backend,
        parity=gated(parity(whole, reference), setup, floor_of(reference, exact))
        | {"replicas_max_rel_diff": replicas_agree(results, mode)},
        native=native,
        memory={
            "predicted": predicted,
            "measured": {k: results[0].memory[k] for k in ("params", "grads", "optimizer", "activations")},
        },
        comm={"predicted": comm_pred, "measured": comm_meas},
        setup=setup.as_dict()
        | {
            "model": cfg.name,
            "model_config": cfg.name,
            "n_experts": cfg.n_experts,
            "top_k": cfg.top_k,
            "capacity_factor": capacity_factor,
            "aux_alpha": aux_alpha,
            "ep": degree,
            "mode": mode,
        },
        losses=whole.losses,
        routing=routing_report(
            whole.routing, whole.ce, degree if mode == "ep" else 1, cfg.hidden, measured_a2a, seconds
        ),
    )
