"""The pipeline executor: play one rank's list of a ``Schedule`` on its chunks of the GPT.

Our GPT in pieces: piece 0 is the embedding, pieces 1..L the blocks, piece L+1 the final norm,
head and loss; a stage is a contiguous range of pieces (``Chunk``). ``run_step`` plays the *same*
``Schedule`` objects that the simulator plays (``playbook.theory.pp.types``): its actions, in
order, with ``isend`` (never blocks) and receives that block where the list has them (posted up
front with ``irecv``, waited on there), tagged by (micro-batch, receiving stage). Each
micro-batch's loss is the sum of its token losses divided by the global batch's token count, so
the m backward passes add up to the gradient of the global batch's mean loss, exactly as the
single-process reference computes it.

ZB-H1 (Qi et al. 2023, arXiv:2401.10241) splits the backward: B = ``torch.autograd.grad`` of the
stage output w.r.t. the stage input *and* w.r.t. the output of every module that owns parameters
(the weights are not asked for, so autograd skips their matmuls). As in the paper (§2), W needs
only each such module's input and its output gradient: F keeps the inputs (forward hooks), B keeps
the output gradients and frees the graph, and W is ``grad_out.T @ input`` per linear layer (a norm
or an embedding, elementwise or a lookup, replays its forward on its input, one node deep). So a
micro-batch between B and W holds ``theory.pp.pipeline.chunk_w_bytes``, not its whole graph. A stage
with any other parameter-owning module (tensor-parallel layers, whose forward may communicate)
keeps its graph until W, and W is ``autograd.grad`` of each module's output, one node deep.

Under full recomputation (Chen et al. 2016; ``parallel.hybrid.recompute``) F keeps each block's input
only, and nothing of the modules inside it: B's ``autograd.grad`` recomputes every block once, and
the inputs W needs are taken from that recomputation (forward pre-hooks) and kept until W, as
Megatron-LM's zero-bubble schedules keep them from B (Qi et al. 2023, §2).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd.graph import get_gradient_edge

from playbook.measure.held import HeldActivations
from playbook.parallel.pp.weights import REPLAYED, accumulate, compact, recomputed, weight_grads
from playbook.theory.pp.simulator import Slot
from playbook.theory.pp.types import Schedule


# ---- the model in pieces -----------------------------------------------------------------------
class Pieces(nn.Module):
    """Pieces of a GPT under their names in it: ``tok_emb`` (piece 0), ``blocks.<i>`` (piece i+1),
    ``norm`` and ``lm_head`` (piece L+1). Holds the GPT's own modules (not copies), so parameters and
    gradients compare with the single process name for name. A rank's share of the model is the
    ``Pieces`` of all its chunks: what its optimizer steps and its result reports."""

    def __init__(self, model: nn.Module, pieces):
        super().__init__()
        L, pieces = model.cfg.n_layers, sorted(set(pieces))
        if 0 in pieces:
            self.tok_emb = model.tok_emb
        self.blocks = nn.ModuleDict({str(i - 1): model.blocks[i - 1] for i in pieces if 1 <= i <= L})
        if L + 1 in pieces:
            self.norm, self.lm_head = model.norm, model.lm_head


class Chunk(Pieces):
    """The contiguous pieces [start, end) as one stage: calls the model's own ``embed``, ``head``
    and ``loss``, so a tensor-parallel GPT is chunked alike. ``positions`` ([s/cp] int64, None:
    0..s-1): the RoPE positions of this rank's tokens under context parallelism, given to every block.

    ``run(piece, fn, x)`` runs each piece (default ``fn(x)``): ZeRO-3 puts its own runner there, which
    gathers a piece's weights before it and frees them after (``hybrid.zero``). ``global_tokens``: the
    global batch's token count, which the loss divides the sum of this micro-batch's token losses by
    (``model.gpt.lm_loss``), so that every micro-batch's loss on every rank is its share of the global mean."""

    def __init__(
        self, model: nn.Module, start: int, end: int, positions: torch.Tensor | None = None, *, global_tokens: int
    ):
        super().__init__(model, range(start, end))
        self.start, self.end, self.first, self.last = start, end, start == 0, end == model.cfg.n_layers + 2
        self.embed, self.head, self.loss = model.embed, model.head, model.loss  # bound methods, not modules
        self.positions, self.global_tokens = positions, global_tokens
        self.run = lambda piece, fn, x: fn(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.run(0, self.embed, x)  # tokens [b, s] -> [b, s, hidden] (SP: [b, s/tp, hidden])
        for i, block in self.blocks.items():
            x = self.run(int(i) + 1, lambda x, block=block: block(x, self.positions), x)  # [b, s, hidden]
        if self.last:
            x = self.run(self.end - 1, self.head, x)  # [b, s, vocab]
        return x


def check_microbatches(setup, m: int) -> None:
    if setup.global_batch % m:
        good = ", ".join(str(d) for d in range(1, setup.global_batch + 1) if setup.global_batch % d == 0)
        raise ValueError(f"m={m} micro-batches do not split global_batch={setup.global_batch}; try m in {{{good}}}")


def microbatches(setup, step: int, m: int, device) -> tuple[list, list]:
    """The global batch of ``step`` in m micro-batches, each its own storage (the saved token ids
    of one micro-batch must not pin the whole batch)."""
    check_microbatches(setup, m)
    tokens, targets = setup.task().batch(step, setup.global_batch, setup.seq_len, device=device)  # [global_batch, s]
    return [t.clone() for t in tokens.chunk(m)], [t.clone() for t in targets.chunk(m)]


# ---- the executor: play one rank's list of actions ---------------------------------------------
@dataclass
class StepLog:
    """What one rank saw in one step: compute slots (perf_counter seconds) and held-activation bytes."""

    slots: list[Slot] = field(default_factory=list)
    loss: float = 0.0  # Σ token losses / global tokens over the m micro-batches (last stage only)
    chunk_bytes: dict[int, int] = field(default_factory=dict)  # bytes saved by one F, per chunk
    peak_bytes: int = 0
    sends: list[tuple[int, float, float]] = field(default_factory=list)  # (tag, issued, returned)
    recvs: list[tuple[int, float, float]] = field(default_factory=list)  # (tag, posted, data here)


def _tag(mb: int, stage: int, n_stages: int, grad: bool) -> int:
    return (mb * n_stages + stage) * 2 + int(grad)


def run_step(
    schedule: Schedule,
    rank: int,
    chunks: list[Chunk],
    tokens: list[torch.Tensor],
    targets: list[torch.Tensor],
    shape: tuple,
    group,
    held: HeldActivations,
    *,
    tracer=None,
    prepost: bool = True,
) -> StepLog:
    """Play ``schedule.actions[rank]`` once: micro-batch inputs ``tokens[i]``, ``targets[i]``; every
    activation and gradient message has ``shape`` ([micro_batch, seq, hidden]). Gradients
    accumulate into ``p.grad`` of the chunks' parameters. ``rank`` and the peers are ranks of
    ``group``. A receive blocks where the list has it; with ``prepost`` its buffer was handed to
    gloo at the start of the step (the blocking point, and so the deadlock analysis, is the same)."""
    n, split = schedule.n_stages, schedule.split_backward
    live: dict[tuple[int, int], dict] = {}  # (mb, chunk) -> input, output, gradients, captured
    mailbox: dict[int, torch.Tensor] = {}  # messages to this same rank (p == 1)
    sends, log = [], StepLog()
    device = tokens[0].device  # (a ZeRO-3 chunk has no parameters of its own between pieces)
    span = tracer.span if tracer is not None else (lambda name: contextlib.nullcontext())

    def send(t: torch.Tensor, peer: int, tag: int) -> None:
        t0 = time.perf_counter()
        if peer == rank:
            mailbox[tag] = t
        else:  # torch reads dst as a global rank: translate the pipeline-local peer
            sends.append(dist.isend(t.contiguous(), dst=dist.get_global_rank(group, peer), group=group, tag=tag))
        log.sends.append((tag, t0, time.perf_counter()))

    # Post every receive of the step up front (irecv): gloo moves a payload once the receiver has
    # asked for it, so a receive posted only when needed would add a round trip on the critical path.
    posted: dict[int, tuple] = {}
    for a in schedule.actions[rank] if prepost else ():
        if a.kind.startswith("recv") and a.peer != rank:
            tag = _tag(a.mb, schedule.stage(rank, a.chunk), n, a.kind == "recv_B")
            buf = torch.empty(shape, device=device)  # [micro_batch, seq, hidden]
            posted[tag] = (buf, dist.irecv(buf, src=dist.get_global_rank(group, a.peer), group=group, tag=tag))

    def recv(peer: int, tag: int) -> torch.Tensor:
        if peer == rank:
            return mailbox.pop(tag)
        t0 = time.perf_counter()
        if tag in posted:
            buf, work = posted.pop(tag)
            work.wait()  # blocks here, where the schedule says the data is needed
        else:
            buf = torch.empty(shape, device=device)  # [micro_batch, seq, hidden]
            dist.recv(buf, src=dist.get_global_rank(group, peer), group=group, tag=tag)
        log.recvs.append((tag, t0, time.perf_counter()))
        return buf

    for a in schedule.actions[rank]:
        s = schedule.stage(rank, a.chunk)
        st = live.setdefault((a.mb, a.chunk), {})
        chunk = chunks[a.chunk]
        if a.kind == "recv_F":
            st["input"] = recv(a.peer, _tag(a.mb, s, n, False)).requires_grad_()  # [b, s, hidden]
        elif a.kind == "recv_B":
            st["grad_out"] = recv(a.peer, _tag(a.mb, s, n, True))  # [b, s, hidden]
        elif a.kind == "send_F":
            send(st["output"].detach(), a.peer, _tag(a.mb, s + 1, n, False))
        elif a.kind == "send_B":
            send(st.pop("grad_in"), a.peer, _tag(a.mb, s - 1, n, True))
        else:
            t0 = time.perf_counter()
            with span(a.kind):
                _compute(a.kind, st, chunk, s == 0, tokens[a.mb], targets[a.mb], split, held, log, a.chunk)
            log.slots.append(Slot(rank, a.kind, a.mb, a.chunk, t0, time.perf_counter()))
            if a.kind == ("W" if split else "B"):
                for k in ("output", "input", "captured", "grad_ys", "inputs"):  # the graph goes with them
                    st.pop(k, None)
    for work in sends:
        work.wait()
    log.peak_bytes = held.peak
    return log


def _compute(kind, st, chunk, first, tokens, targets, split, held, log, c) -> None:
    if kind == "F":
        before = held.now
        captured: list = []  # (module, its parameters, its input, its output), in forward order
        hooks, redone = [], recomputed(chunk)
        if split:  # remember every module that owns parameters, with its input and output, for B and W
            for mod in chunk.modules():
                own = list(mod.parameters(recurse=False))
                if own:
                    hooks.append(
                        mod.register_forward_hook(
                            lambda mod, a, out, own=own: captured.append(
                                # inside a recomputed block: neither tensor, only where B starts from
                                (mod, own, None, get_gradient_edge(out)) if mod in redone else (mod, own, a[0], out)
                            )
                        )
                    )
        with held.hooks():
            x = tokens if first else st["input"]  # tokens [b, s] or activations [b, s, hidden]
            y = chunk(x)  # [b, s, hidden] or logits [b, s, vocab]
            if chunk.last:  # Σ token losses / global tokens: this micro-batch's share of the global mean
                y = chunk.loss(y, targets, chunk.global_tokens)
                log.loss += float(y.detach())
        for h in hooks:
            h.remove()
        st["output"], st["captured"] = y, captured
        st["lean"] = all(type(mod) is nn.Linear or type(mod) in REPLAYED for mod, *_ in captured)
        if split and st["lean"]:  # W's inputs: saved by autograd already, so they add no bytes here
            st["inputs"] = [None if x is None else held.keep(x) for _, _, x, _ in captured]
        log.chunk_bytes.setdefault(c, held.now - before)
    elif kind == "B":
        out, grad_out = st["output"], st.pop("grad_out", None)  # None for the loss: d loss / d loss = 1
        if not split:
            torch.autograd.backward(out, grad_out)  # accumulates into p.grad; frees the graph
            if not first:
                st["grad_in"] = st["input"].grad  # [b, s, hidden]
            return
        ys = [y for *_, y in st["captured"]]
        inputs = ([] if first else [st["input"]]) + ys
        lean = st["lean"]
        redone: dict = {}  # module -> its input as this B's recomputation of its block saw it
        hooks = [
            mod.register_forward_pre_hook(lambda mod, a: redone.setdefault(mod, a[0]))
            for mod, _, x, _ in st["captured"]
            if x is None  # inside a recomputed block
        ]
        grads = torch.autograd.grad(out, inputs, grad_out, retain_graph=not lean)  # lean: frees the graph
        for h in hooks:
            h.remove()
        if not first:
            st["grad_in"], grads = grads[0], grads[1:]
        if lean:  # keep what W needs (the inputs, kept at F or recomputed here, and the output gradients)
            st["grad_ys"] = [held.keep(compact(g)) for g in grads]
            mods = [mod for mod, *_ in st["captured"]]
            st["captured"] = [(mod, own) for mod, own, *_ in st["captured"]]
            for k in ("output", "input"):
                st.pop(k, None)  # the graph, and with it the recomputed blocks' inputs, goes first
            st["inputs"] = [held.keep(redone[mod]) if x is None else x for mod, x in zip(mods, st["inputs"])]
        else:  # the graph stays for W; a module of a recomputed block keeps its recomputed input and output gradient
            st["grad_ys"] = [
                g if x is not None else held.keep(compact(g)) for (_, _, x, _), g in zip(st["captured"], grads)
            ]
            st["inputs"] = [x if x is not None else held.keep(redone[mod]) for mod, _, x, _ in st["captured"]]
    elif st["lean"]:  # W from each module's input and output gradient alone
        for (mod, own), x, g in zip(st["captured"], st.pop("inputs"), st["grad_ys"]):
            for p, gp in zip(own, weight_grads(mod, own, held.unpack(x), held.unpack(g))):
                accumulate(p, gp)
    else:  # W on the kept graph, one node deep per module, its weights only; in a recomputed block from B's tensors
        for (mod, own, x, y), xr, g in zip(st["captured"], st.pop("inputs"), st["grad_ys"]):
            if x is None:
                grads = weight_grads(mod, own, held.unpack(xr), held.unpack(g))
            else:
                grads = torch.autograd.grad(y, own, g, retain_graph=True)
            for p, gp in zip(own, grads):
                accumulate(p, gp)
