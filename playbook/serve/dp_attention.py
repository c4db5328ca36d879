"""DP attention under continuous batching (``playbook serve-bench --attention-dp``): each rank its own
scheduler, the MoE layers in lockstep.

Each of the n ranks is a DP-attention replica (the whole attention, its own requests' paged KV) with
E/n experts of every MoE layer (``serve.experts.build``: ``ExpertParallelMoE`` over the ranks). Its
``serve.batching.ContinuousBatcher`` schedules its own requests, but every MoE layer's dispatch and
combine need every rank, so the ranks agree before each forward: one all-reduce of a flag (1: this
rank has tokens this step). A rank with none, or done, runs an *idle* forward: every MoE layer on zero
tokens, which still receives and computes the rows other ranks send its experts (SGLang's idle
batches under DP attention; DeepSeek-V3, arXiv:2412.19437, §3.4.2). When the flags sum to zero every
rank is done. Collectives pair in order, so a rank's forwards need not fall on the same scheduler step.

Measured against predicted: the all-to-all bytes each rank sent over the whole run equal those the
routing counts of every forward (real and idle, prefill chunks included) fix
(``theory.serving.parallel.ep_forward_alltoall_bytes``); tokens are checked by ``serve.serve_bench``.
"""

from __future__ import annotations

import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.parallel.comm import all_reduce
from playbook.serve.batching import ContinuousBatcher, Request
from playbook.serve.experts import build, predicted_alltoall_bytes


class Lockstep:
    """The EP model, whose every forward starts with the ranks' flag all-reduce (``embed`` is
    where ``serve.packed.forward_packed`` starts); everything else is the model's."""

    def __init__(self, model, group):
        self.inner, self.flags, self.forwards, self.idle = model, group, 0, 0  # not .group: TP's name

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _flag(self, busy: int) -> int:
        return int(all_reduce(torch.tensor([busy]), self.flags, "dp attention", "step").item())

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        self._flag(1)
        self.forwards += 1
        return self.inner.embed(tokens)

    def idle_until_all_done(self) -> None:
        """Idle forwards (every MoE layer on zero tokens) while another rank still has tokens."""
        empty = torch.zeros(0, 1, self.inner.cfg.hidden)  # [0, 1, h]
        while self._flag(0):
            for block in self.inner.blocks:
                block.mlp(empty)  # dispatch nothing, compute what others send, combine
            self.idle += 1


@torch.no_grad()
def dp_attention_serve_on_rank(
    ctx,
    *,
    cfg: ModelConfig,
    seed: int,
    dims: ParallelDims,
    requests: list[Request],
    n_blocks: int,
    block_size: int,
    max_batch: int,
    prefix_cache: bool = False,
    assign: list[int] | None = None,
    token_budget: int | None = None,
) -> dict:
    """``serve.ranks.serve_on_rank``'s answer for a DP-attention rank (``dims.dp`` ranks, experts over
    all), plus its forwards, idle forwards and all-to-all bytes measured and predicted."""
    from playbook.model.moe import moe_layers

    model, mesh = build(ctx, cfg, seed, dims.dp)
    me = mesh.index("dp_cp")
    where = assign if assign is not None else [r.id % dims.dp for r in requests]
    mine = [r for r in requests if where[r.id] == me]
    lock = Lockstep(model, mesh.group("dp_cp"))
    routing: list = []
    hooks = [
        m.register_forward_hook(lambda mod, i, o: routing.append(mod.stats.counts_by_rank)) for m in moe_layers(model)
    ]
    batcher = ContinuousBatcher(
        lock,
        n_blocks=n_blocks,
        block_size=block_size,
        max_batch=max_batch,
        prefix_cache=prefix_cache,
        token_budget=token_budget,
    )
    try:
        run = batcher.run(mine)
        lock.idle_until_all_done()
    finally:
        for h in hooks:
            h.remove()
    sent = sum(s.sent_bytes for s in ctx.tracer.spans if s.kind == "comm" and s.name == "all_to_all_single")
    return {
        "rank": ctx.rank,
        "coords": {"tp": 0, "dp": me},
        "tokens": run.tokens,
        "logits": run.logits,
        "cached": run.cached,
        "evictions": getattr(batcher.cache, "evictions", 0),
        "steps": run.steps,
        "decoded": sum(len(s["decoded"]) for s in run.steps),
        "computed": sum(len(s["decoded"]) + s["prefill_tokens"] for s in run.steps),
        "layer_bytes": 0.0,
        "forwards": lock.forwards,
        "idle_forwards": lock.idle,
        "alltoall_bytes": {
            "measured": sent,
            "predicted": predicted_alltoall_bytes(routing, dims.dp, cfg.hidden)[me] if routing else 0.0,
        },
    }


def check_attention_dp(cfg: ModelConfig, *, tp: int, dp: int) -> None:
    """``serve-bench --attention-dp``: an MoE model, tp 1, the experts split over the --dp ranks."""
    from playbook.theory.serving.moe_layouts import check_moe_layout

    if tp != 1 or dp < 2:
        raise ValueError(
            f"--attention-dp serves on --dp DP-attention ranks, the experts over all of them (got --tp {tp} --dp {dp}); "
            "use --tp 1 --dp 2 or more"
        )
    check_moe_layout(cfg, gpus=dp, attention_tp=1)
