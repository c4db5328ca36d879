"""Pipeline parallelism on real ranks: the model cut into stages, micro-batches passed along.

The idea (GPipe, Huang et al. 2019; PipeDream-Flush/1F1B and interleaving, Narayanan et al. 2021
§2.2; zero bubble, Qi et al. 2023): give each of p ranks a contiguous slice of the layers (or v
slices, interleaved), split the global batch into m micro-batches, and let rank r send the
activation of each micro-batch to rank r+1 after its forward, and the gradient to rank r−1 after
its backward. While micro-batch i is on rank 1, micro-batch i+1 can be on rank 0: the ranks work
at the same time except at the start and the end (the *bubble*, (p−1)/m of the ideal time for
GPipe and 1F1B, ``playbook.theory.schedules``).

Our GPT in pieces: piece 0 is the embedding, pieces 1..L the blocks, piece L+1 the final norm,
head and loss; a stage is a contiguous range of pieces (``Chunk``). The executor ``run_step``
plays the *same* ``Schedule`` objects that the simulator plays: its actions, in order, with
``isend`` (never blocks) and receives that block where the list has them (posted up front with
``irecv``, waited on there), tagged by (micro-batch, receiving stage). Each
micro-batch's loss is divided by m, so the m backward passes add up to the gradient of the global
batch's mean loss, exactly as the single-process reference ``train(setup)`` computes it.

ZB-H1 splits the backward: B = ``torch.autograd.grad`` of the stage output w.r.t. the stage input
*and* w.r.t. the output of every module that owns parameters (the weights are not asked for, so
autograd skips their matmuls); W = for each such module, ``autograd.grad(its output, its
parameters, that output's gradient)``, one node deep. Exact, and W costs what a weight gradient
costs. (Our W keeps the stage's whole graph until it runs; the paper keeps only what W needs.)

Native counterpart: ``torch.distributed.pipelining`` (PipelineStage with ScheduleGPipe,
Schedule1F1B, ScheduleInterleaved1F1B, and ScheduleInterleavedZeroBubble) on the same chunks.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from playbook.cluster import default_backend, launch
from playbook.measure.memory import optimizer_bytes
from playbook.model import GPT, lm_loss
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.activations import INDEX_BYTES, block_activation_bytes
from playbook.theory.schedules import (
    DEFINITIONS, Costs, Schedule, Slot, Timeline, check_pipeline, equal_partition, held_bytes, make_schedule, simulate,
)  # fmt: skip


@dataclass(frozen=True)
class PipelineSetup(TrainSetup):
    """``TrainSetup`` with the preset's depth changed (``n_layers``, 0 keeps it), so that 4 ranks ×
    2 chunks have 8 layers to share. ``train(setup)`` builds the same deeper model: still the reference."""

    n_layers: int = 0

    def config(self):
        cfg = super().config()
        return cfg.replace(n_layers=self.n_layers) if self.n_layers else cfg


# ---- the model in pieces -----------------------------------------------------------------------
class Chunk(nn.Module):
    """Pieces [start, end) of a GPT: 0 the embedding, 1..L the blocks, L+1 the final norm and head.
    Holds the GPT's own modules (not copies), so parameter names map back to the full model, and
    calls the model's own ``embed``, ``head`` and ``loss``: a tensor-parallel GPT is chunked alike."""

    def __init__(self, model: GPT, start: int, end: int):
        super().__init__()
        L = model.cfg.n_layers
        self.start, self.end, self.first, self.last = start, end, start == 0, end == L + 2
        self.tok_emb = model.tok_emb if self.first else None
        self.blocks = nn.ModuleList(model.blocks[i - 1] for i in range(max(start, 1), min(end, L + 1)))
        self.norm = model.norm if self.last else None
        self.lm_head = model.lm_head if self.last else None
        self.embed, self.head, self.loss = model.embed, model.head, model.loss  # bound methods, not modules
        full = {id(p): n for n, p in model.named_parameters()}
        self.names = {n: full[id(p)] for n, p in self.named_parameters()}  # chunk name -> GPT name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x)  # tokens [b, s] -> [b, s, hidden]
        for block in self.blocks:
            x = block(x)  # [b, s, hidden]
        if self.last:
            x = self.head(x)  # [b, s, vocab]
        return x


def chunk_activation_bytes(cfg, start: int, end: int, micro_batch: int, seq_len: int, dtype_bytes: int = 4) -> int:
    """Predicted bytes autograd saves for one micro-batch on pieces [start, end)
    (``playbook.theory.activations``: tokens, blocks, final norm, log-probabilities, targets)."""
    b, s, h, V, B = micro_batch, seq_len, cfg.hidden, cfg.vocab_size, dtype_bytes
    L = cfg.n_layers
    n_blocks = max(0, min(end, L + 1) - max(start, 1))
    total = n_blocks * block_activation_bytes(cfg, seq_len=s, micro_batch=b, dtype_bytes=B)
    if start == 0:
        total += b * s * INDEX_BYTES  # token ids, saved by the embedding
    if end == L + 2:
        total += (3 * b * s * h + b * s) * B + b * s * V * B + b * s * INDEX_BYTES + B  # norm, log-probs, targets, total_weight
    return total


# ---- measuring what autograd holds -------------------------------------------------------------
class _Ticket:
    __slots__ = ("owner", "key", "tensor")

    def __init__(self, owner, key, tensor):
        self.owner, self.key, self.tensor = owner, key, tensor

    def __del__(self):
        self.owner.release(self.key)


class HeldActivations:
    """Saved-tensor hooks that count the bytes autograd holds *right now*: a storage is added when
    first saved and removed when autograd drops its last saved reference (after backward frees the
    graph). ``peak`` is the high-water mark; parameters and buffers of ``exclude`` are not counted."""

    def __init__(self, exclude: nn.Module):
        self.skip = {t.untyped_storage().data_ptr() for t in [*exclude.parameters(), *exclude.buffers()]}
        self.refs: dict[int, list[int]] = {}
        self.now = self.peak = 0

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.skip or storage.nbytes() == 0:
            return t
        if key in self.refs:
            self.refs[key][0] += 1
        else:
            self.refs[key] = [1, storage.nbytes()]
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        return _Ticket(self, key, t.detach())  # detached: holding t itself would tie an output to its own grad_fn (a cycle)

    @staticmethod
    def unpack(x):
        return x.tensor if isinstance(x, _Ticket) else x

    def release(self, key: int) -> None:
        entry = self.refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.refs[key]

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


# ---- the executor: play one rank's list of actions ---------------------------------------------
@dataclass
class StepLog:
    """What one rank saw in one step: compute slots (perf_counter seconds) and held-activation bytes."""

    slots: list[Slot] = field(default_factory=list)
    loss: float = 0.0  # sum of the micro-batch losses / m (last stage only)
    chunk_bytes: dict[int, int] = field(default_factory=dict)  # bytes saved by one F, per chunk
    peak_bytes: int = 0
    sends: list[tuple[int, float, float]] = field(default_factory=list)  # (tag, issued, returned)
    recvs: list[tuple[int, float, float]] = field(default_factory=list)  # (tag, posted, data here)


def _tag(mb: int, stage: int, n_stages: int, grad: bool) -> int:
    return (mb * n_stages + stage) * 2 + int(grad)


def run_step(schedule: Schedule, rank: int, chunks: list[Chunk], tokens: list[torch.Tensor], targets: list[torch.Tensor],
             shape: tuple, group, held: HeldActivations, tracer=None, prepost: bool = True) -> StepLog:  # fmt: skip
    """Play ``schedule.actions[rank]`` once: micro-batch inputs ``tokens[i]``, ``targets[i]``; every
    activation and gradient message has ``shape`` ([micro_batch, seq, hidden]). Gradients
    accumulate into ``p.grad`` of the chunks' parameters. A receive blocks where the list has it;
    with ``prepost`` its buffer was handed to gloo at the start of the step (the blocking point, and
    so the deadlock analysis, is the same)."""
    n, m, split = schedule.n_stages, schedule.m, schedule.split_backward
    live: dict[tuple[int, int], dict] = {}  # (mb, chunk) -> input, output, gradients, captured
    mailbox: dict[int, torch.Tensor] = {}  # messages to this same rank (p == 1)
    sends, log = [], StepLog()
    device = next(chunks[0].parameters()).device
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
                _compute(a.kind, st, chunk, s == 0, tokens[a.mb], targets[a.mb], m, split, held, log, a.chunk)
            log.slots.append(Slot(rank, a.kind, a.mb, a.chunk, t0, time.perf_counter()))
            if a.kind == ("W" if split else "B"):
                for k in ("output", "input", "captured", "grad_ys"):  # the graph goes with them: autograd frees it
                    st.pop(k, None)
    for work in sends:
        work.wait()
    log.peak_bytes = held.peak
    return log


def _compute(kind, st, chunk, first, tokens, targets, m, split, held, log, c) -> None:
    if kind == "F":
        before = held.now
        captured: list = []
        hooks = []
        if split:  # remember the output of every module that owns parameters, for B and W
            for mod in chunk.modules():
                own = list(mod.parameters(recurse=False))
                if own:
                    hooks.append(mod.register_forward_hook(lambda mod, i, out, own=own: captured.append((out, own))))
        with held.hooks():
            x = tokens if first else st["input"]
            y = chunk(x)  # [b, s, hidden] or logits [b, s, vocab]
            if chunk.last:
                y = chunk.loss(y, targets) / m  # this micro-batch's share of the global mean loss
                log.loss += float(y.detach())
        for h in hooks:
            h.remove()
        st["output"], st["captured"] = y, captured
        log.chunk_bytes.setdefault(c, held.now - before)
    elif kind == "B":
        out, grad_out = st["output"], st.pop("grad_out", None)  # None for the loss: d loss / d loss = 1
        if not split:
            torch.autograd.backward(out, grad_out)  # accumulates into p.grad; frees the graph
            if not first:
                st["grad_in"] = st["input"].grad
            return
        ys = [y for y, _ in st["captured"]]
        inputs = ([] if first else [st["input"]]) + ys
        grads = torch.autograd.grad(out, inputs, grad_out, retain_graph=True)
        if not first:
            st["grad_in"], grads = grads[0], grads[1:]
        st["grad_ys"] = grads
    else:  # W: one node deep per module, its weights only
        for (y, own), g in zip(st["captured"], st["grad_ys"]):
            for p, gp in zip(own, torch.autograd.grad(y, own, g, retain_graph=True)):
                p.grad = gp if p.grad is None else p.grad + gp


def piece_costs(setup: TrainSetup, micro_batch: int, repeats: int = 5) -> dict[str, list[float]]:
    """Measure each piece (embedding, every block, head + loss) alone in this process: median
    forward and backward seconds for one micro-batch (the fastest of ``repeats`` after a warm-up, on
    one thread like a rank: the least disturbed by other work on the machine), and the exact
    activation bytes it saves. Feed ``f + b`` (time) or ``bytes`` (memory) to ``balanced_partition``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _piece_costs(setup, micro_batch, repeats)
    finally:
        torch.set_num_threads(threads)


def _piece_costs(setup: TrainSetup, micro_batch: int, repeats: int) -> dict[str, list[float]]:
    cfg = setup.config()
    model = GPT(cfg, seed=setup.seed)
    tokens, targets = setup.task().batch(0, micro_batch, setup.seq_len)
    out = {"f": [], "b": [], "bytes": []}
    for i in range(cfg.n_layers + 2):
        chunk = Chunk(model, i, i + 1)
        fs, bs = [], []
        for _ in range(repeats + 1):
            x = tokens if i == 0 else torch.randn(micro_batch, setup.seq_len, cfg.hidden, requires_grad=True)
            t0 = time.perf_counter()
            y = chunk(x)  # [b, s, hidden] or [b, s, vocab]
            y = lm_loss(y, targets) if chunk.last else y
            t1 = time.perf_counter()
            y.backward(None if chunk.last else torch.ones_like(y))
            t2 = time.perf_counter()
            fs.append(t1 - t0)
            bs.append(t2 - t1)
        out["f"].append(min(fs[1:]))
        out["b"].append(min(bs[1:]))
        out["bytes"].append(chunk_activation_bytes(cfg, i, i + 1, micro_batch, setup.seq_len))
    model.zero_grad(set_to_none=True)
    return out


# ---- a whole training run on one rank ----------------------------------------------------------
def check_microbatches(setup: TrainSetup, m: int) -> None:
    if setup.global_batch % m:
        good = ", ".join(str(d) for d in range(1, setup.global_batch + 1) if setup.global_batch % d == 0)
        raise ValueError(f"m={m} micro-batches do not split global_batch={setup.global_batch}; try m in {{{good}}}")


def microbatches(setup: TrainSetup, step: int, m: int, device) -> tuple[list, list]:
    """The global batch of ``step`` in m micro-batches, each its own storage (the saved token ids
    of one micro-batch must not pin the whole batch)."""
    check_microbatches(setup, m)
    tokens, targets = setup.task().batch(step, setup.global_batch, setup.seq_len, device=device)
    return [t.clone() for t in tokens.chunk(m)], [t.clone() for t in targets.chunk(m)]


def stage_ranges(cfg, n_stages: int, partition=None) -> list[tuple[int, int]]:
    """Pieces per virtual stage: ``partition`` if given (e.g. ``balanced_partition`` of measured
    costs), else equal block counts with the embedding on the first stage and the head on the last."""
    if n_stages > cfg.n_layers + 2:
        raise ValueError(f"{n_stages} stages but {cfg.n_layers} layers plus embedding and head; use stages <= {cfg.n_layers + 2}")
    ranges = list(partition) if partition is not None else equal_partition(cfg.n_layers, n_stages)
    if len(ranges) != n_stages or ranges[0][0] != 0 or ranges[-1][1] != cfg.n_layers + 2:
        raise ValueError(f"partition must be {n_stages} contiguous ranges covering pieces 0..{cfg.n_layers + 1}; got {ranges}")
    return ranges


def train_pipeline(ctx, setup: TrainSetup, name: str, m: int, v: int = 1, partition=None, group=None,
                   prepost: bool = True) -> dict:  # fmt: skip
    """Rank function: train ``setup`` with schedule ``name`` on this rank's chunks; returns its
    losses (last rank), first-step gradients and final parameters (GPT names), and per-step logs.
    ``partition``: pieces per virtual stage (default ``equal_partition``); ``prepost``: see ``run_step``."""
    group = group if group is not None else ctx.group
    p, rank, cfg = dist.get_world_size(group), dist.get_rank(group), setup.config()
    check_pipeline(p, m, v, name=name, n_layers=cfg.n_layers)
    if cfg.tie_embeddings:
        raise NotImplementedError("a tied embedding lives on the first and the last stage, whose gradients would have to be "
                                  "summed across them; use an untied preset such as gpt-tiny")  # fmt: skip
    schedule = make_schedule(name, p, m, v)
    ranges = stage_ranges(cfg, p * v, partition)
    model = GPT(cfg, seed=setup.seed).to(ctx.device)
    chunks = [Chunk(model, *ranges[schedule.stage(rank, c)]) for c in range(v)]
    params = [q for ch in chunks for q in ch.parameters()]
    optimizer = torch.optim.AdamW(params, lr=setup.lr)
    held = HeldActivations(model)
    shape = (setup.global_batch // m, setup.seq_len, cfg.hidden)
    logs, grads, times, memory = [], {}, [], {}
    for step in range(setup.steps):
        tokens, targets = microbatches(setup, step, m, ctx.device)
        optimizer.zero_grad(set_to_none=True)
        held.peak = held.now
        t0 = time.perf_counter()
        logs.append(run_step(schedule, rank, chunks, tokens, targets, shape, group, held, ctx.tracer, prepost))
        times.append(time.perf_counter() - t0)
        if step == 0:
            grads = {ch.names[n]: q.grad.detach().cpu().clone() for ch in chunks for n, q in ch.named_parameters()}
        optimizer.step()
        if step == 0:
            memory = {"params": sum(q.numel() * q.element_size() for q in params),
                      "grads": sum(q.grad.numel() * q.grad.element_size() for q in params if q.grad is not None),
                      "optimizer": optimizer_bytes(optimizer), "activations": logs[0].peak_bytes}  # fmt: skip
        ctx.progress(step + 1, setup.steps)
    params_out = {ch.names[n]: q.detach().cpu().clone() for ch in chunks for n, q in ch.named_parameters()}
    return {"rank": rank, "losses": [lg.loss for lg in logs], "grads": grads, "params": params_out, "logs": logs, "step_s": times, "memory": memory,
            "ranges": [ranges[schedule.stage(rank, c)] for c in range(v)]}  # fmt: skip


def merge(results: list[dict]) -> TrainResult:
    """One TrainResult from every rank's share (the loss lives on the rank of the last stage)."""
    grads, params = {}, {}
    for r in results:
        grads |= r["grads"]
        params |= r["params"]
    last = max(results, key=lambda r: sum(abs(x) for x in r["losses"]))
    return TrainResult(last["losses"], grads, params)


# ---- predicted vs measured ---------------------------------------------------------------------
def measured_timeline(results: list[dict], step: int = -1) -> Timeline:
    """The real run's step ``step`` as a Timeline (times in seconds from its first compute)."""
    slots = [s for r in results for s in r["logs"][step].slots]
    t0 = min(s.start for s in slots)
    slots = [Slot(s.rank, s.kind, s.mb, s.chunk, s.start - t0, s.end - t0) for s in slots]
    return Timeline(len(results), slots)


def measured_costs(results: list[dict], schedule: Schedule, steps=None) -> Costs:
    """Per-virtual-stage mean F, B, W seconds over the given steps (default: all but the first,
    which pays one-off costs), for the simulator; with means, the simulated busy time of every rank
    equals the measured one, so the bubbles differ only by waiting. Unsplit schedules put the whole
    backward in b. Messages: the mean time to issue a send, and the mean time a receive takes
    once both sides are there (from the later of send and receive to the receive returning)."""
    import statistics

    steps = steps if steps is not None else range(1, len(results[0]["logs"])) or [0]
    per = {k: [[] for _ in range(schedule.n_stages)] for k in "FBW"}
    for r in results:
        for st in steps:
            for s in r["logs"][st].slots:
                per[s.kind][schedule.stage(s.rank, s.chunk)].append(s.end - s.start)

    def mean(xs):
        return [statistics.fmean(x) if x else 0.0 for x in xs]

    issue, latency = [], []
    for st in steps:
        sent = {tag: (t0, t1) for r in results for tag, t0, t1 in r["logs"][st].sends}
        issue += [t1 - t0 for t0, t1 in sent.values()]
        latency += [done - max(posted, sent[tag][0]) for r in results for tag, posted, done in r["logs"][st].recvs
                    if tag in sent]  # fmt: skip
    return Costs(f=mean(per["F"]), b=mean(per["B"]), w=mean(per["W"]), send=statistics.fmean(issue) if issue else 0.0,
                 comm=statistics.fmean(latency) if latency else 0.0)  # fmt: skip


def compare_bubble(results: list[dict], schedule: Schedule, steps=None) -> dict:
    """Measured bubble of each step after the first (both definitions) next to the simulator's
    prediction from this run's own measured per-action costs."""
    steps = list(steps if steps is not None else range(1, len(results[0]["logs"])) or [0])
    costs = measured_costs(results, schedule, steps)
    predicted = simulate(schedule, costs)
    runs = [measured_timeline(results, st) for st in steps]
    measured = {k: sum(t.bubble()[k] for t in runs) / len(runs) for k in DEFINITIONS}
    return {"name": schedule.name, "p": schedule.p, "m": schedule.m, "v": schedule.v,
            "bubble_predicted": predicted.bubble(), "bubble_measured": measured,
            "makespan_predicted_s": predicted.makespan, "makespan_measured_s": sum(t.makespan for t in runs) / len(runs),
            "definition": DEFINITIONS,
            "costs_s": {"f": costs.f, "b": costs.b, "w": costs.w, "send": costs.send, "comm": costs.comm}}  # fmt: skip


def activation_report(results: list[dict], schedule: Schedule, setup: TrainSetup) -> dict:
    """Peak held activation bytes per rank: measured (saved-tensor hooks) vs predicted (the
    schedule's order × the exact per-chunk count), and the peak micro-batch counts."""
    cfg, b = setup.config(), setup.global_batch // schedule.m
    per_chunk = [[chunk_activation_bytes(cfg, *rg, b, setup.seq_len) for rg in r["ranges"]] for r in results]
    tl = simulate(schedule)
    return {"predicted_bytes": held_bytes(schedule, per_chunk), "measured_bytes": [r["logs"][0].peak_bytes for r in results],
            "chunk_bytes_predicted": per_chunk, "chunk_bytes_measured": [r["logs"][0].chunk_bytes for r in results],
            "peak_in_flight": tl.peak_in_flight, "peak_held": tl.peak_held}  # fmt: skip


def predicted_memory(setup: TrainSetup, schedule: Schedule, rank: int = 0, partition=None) -> dict[str, int]:
    """Bytes on ``rank`` in fp32 with AdamW: its chunks' parameters, as many gradient bytes, two
    moments plus a 4-byte step counter per tensor; activations: the schedule's peak (``held_bytes``)."""
    cfg, L = setup.config(), setup.config().n_layers
    ranges = stage_ranges(cfg, schedule.n_stages, partition)
    mine = [ranges[schedule.stage(rank, c)] for c in range(schedule.v)]
    n_params = n_tensors = 0
    for start, end in mine:
        blocks = max(0, min(end, L + 1) - max(start, 1))
        n_params += blocks * cfg.layer_params()
        n_tensors += 9 * blocks
        if start == 0:
            n_params, n_tensors = n_params + cfg.vocab_size * cfg.hidden, n_tensors + 1
        if end == L + 2:
            n_params, n_tensors = n_params + cfg.hidden + cfg.vocab_size * cfg.hidden, n_tensors + 2
    b = setup.global_batch // schedule.m
    per_chunk = [[chunk_activation_bytes(cfg, *ranges[schedule.stage(r, c)], b, setup.seq_len) for c in range(schedule.v)]
                 for r in range(schedule.p)]  # fmt: skip
    return {"params": 4 * n_params, "grads": 4 * n_params, "optimizer": 8 * n_params + 4 * n_tensors,
            "activations": held_bytes(schedule, per_chunk)[rank]}  # fmt: skip


# ---- the native counterpart: torch.distributed.pipelining --------------------------------------
NATIVE = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
          "zb-h1": "ScheduleInterleavedZeroBubble"}  # fmt: skip


def native_limits(name: str, p: int, m: int) -> str | None:
    """Why torch's counterpart cannot run this case (None if it can): its 1F1B-style schedules
    need at least as many micro-batches as stages."""
    if name != "gpipe" and m < p:
        return f"torch.distributed.pipelining.{NATIVE[name]} needs m >= p micro-batches (m={m}, p={p})"
    return None


def train_native(ctx, setup: TrainSetup, name: str, m: int, v: int = 1) -> dict:
    """Rank function: the same chunks driven by ``torch.distributed.pipelining``. Its zero-bubble
    schedule (ScheduleInterleavedZeroBubble) is a multi-stage one: v chunks per rank (v >= 1)."""
    import torch.distributed.pipelining as pipelining

    p, rank, cfg = ctx.world_size, ctx.rank, setup.config()
    check_pipeline(p, m, v if name == "interleaved" else 1, name=name, n_layers=cfg.n_layers)
    if native_limits(name, p, m):
        raise ValueError(native_limits(name, p, m))
    n = p * v
    ranges = stage_ranges(cfg, n)
    model = GPT(cfg, seed=setup.seed).to(ctx.device)
    chunks = [Chunk(model, *ranges[c * p + rank]) for c in range(v)]
    stages = [pipelining.PipelineStage(ch, c * p + rank, n, ctx.device, group=ctx.group) for c, ch in enumerate(chunks)]
    cls = getattr(pipelining, NATIVE[name])
    multi = name in ("interleaved", "zb-h1")
    schedule = cls(stages if multi else stages[0], m, loss_fn=lm_loss)
    optimizer = torch.optim.AdamW([q for ch in chunks for q in ch.parameters()], lr=setup.lr)
    losses, grads, times = [], {}, []
    for step in range(setup.steps):
        tokens, targets = setup.task().batch(step, setup.global_batch, setup.seq_len, device=ctx.device)
        optimizer.zero_grad(set_to_none=True)
        out: list = []
        args = (tokens,) if any(ch.first for ch in chunks) else ()
        kwargs = {"target": targets, "losses": out} if any(ch.last for ch in chunks) else {}
        t0 = time.perf_counter()
        schedule.step(*args, **kwargs)
        times.append(time.perf_counter() - t0)
        losses.append(float(torch.stack(out).detach().mean()) if out else 0.0)
        if step == 0:
            grads = {ch.names[k]: q.grad.detach().cpu().clone() for ch in chunks for k, q in ch.named_parameters()}
        optimizer.step()
    params = {ch.names[k]: q.detach().cpu().clone() for ch in chunks for k, q in ch.named_parameters()}
    return {"rank": rank, "losses": losses, "grads": grads, "params": params, "step_s": times}


# ---- playbook run pp ---------------------------------------------------------------------------
@dataclass
class PipelineReport(RunReport):
    """``RunReport`` plus a ``schedule`` block: name, bubble predicted and measured (both
    definitions, which is which spelled out), peak activations, step time."""

    schedule: dict = field(default_factory=dict)

    def summary(self) -> str:
        s, native = self.schedule, self.native
        skipped = (native or {}).get("skipped")
        self.native = None if skipped else native  # the shared summary expects parity numbers
        try:
            lines = [super().summary()]
        finally:
            self.native = native
        if skipped:
            lines.append(f"  native: skipped, {skipped}")
        lines.append(f"  schedule {s['name']} (p={s['p']}, m={s['m']}, v={s['v']})")
        for k in DEFINITIONS:
            lines.append(f"    bubble {k:<18} predicted {s['bubble_predicted'][k]:.3f}  measured {s['bubble_measured'][k]:.3f}")
        lines.append(f"    peak activations per rank (bytes): predicted {s['activations']['predicted_bytes']}, "
                     f"measured {s['activations']['measured_bytes']}")  # fmt: skip
        return "\n".join(lines)


def add_args(parser) -> None:
    parser.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved", "zb-h1"])
    parser.add_argument("--microbatches", type=int, default=4, help="m: micro-batches per step (divides --global-batch)")
    parser.add_argument("--chunks", type=int, default=1, help="v: model chunks per rank (interleaved only)")
    parser.add_argument("--layers", type=int, default=0, help="override the preset's number of layers (0: keep)")
    parser.add_argument("--no-native", action="store_true", help="skip torch.distributed.pipelining")


def _train_pipeline_counting(ctx, *args) -> dict:
    """``train_pipeline``, plus the bytes this rank sent by op (from the tracer), for the report."""
    out = train_pipeline(ctx, *args)
    out["sent_bytes"] = ctx.tracer.bytes_by_op()
    return out


def predicted_p2p_bytes(plan: Schedule, setup: TrainSetup, rank: int = 0) -> float:
    """Bytes ``rank`` sends point-to-point per step: one activation (forward) or gradient
    (backward) of [global_batch/m, seq, hidden] fp32 per send action to another rank."""
    message = setup.global_batch // plan.m * setup.seq_len * setup.config().hidden * 4
    return float(sum(message for a in plan.actions[rank] if a.kind.startswith("send") and a.peer != rank))


@register("pp", help="pipeline parallel: GPipe, 1F1B, interleaved 1F1B, ZB-H1 on real stages", arguments=add_args)
def run_pp(setup: TrainSetup, *, world_size: int = 2, backend: str = "auto", schedule: str = "1f1b",
           microbatches: int = 4, chunks: int = 1, layers: int = 0, no_native: bool = False) -> PipelineReport:  # fmt: skip
    setup = PipelineSetup(**setup.as_dict(), n_layers=layers) if not isinstance(setup, PipelineSetup) else setup
    check_pipeline(world_size, microbatches, chunks, name=schedule, n_layers=setup.config().n_layers)
    check_microbatches(setup, microbatches)
    backend = default_backend(world_size) if backend == "auto" else backend
    plan = make_schedule(schedule, world_size, microbatches, chunks)
    results = launch(_train_pipeline_counting, world_size, setup, schedule, microbatches, chunks, backend=backend)
    reference = train(setup)
    native = None
    if native_limits(schedule, world_size, microbatches):
        native = {"skipped": native_limits(schedule, world_size, microbatches)}
    elif not no_native:
        nat = launch(train_native, world_size, setup, schedule, microbatches, chunks, backend=backend)
        native = compare(merge(nat), reference, name="single process, same global batch") | {
            "implementation": f"torch.distributed.pipelining.{NATIVE[schedule]}",
            "step_s": sum(r["step_s"][-1] for r in nat) / len(nat)}  # fmt: skip
    ours = merge(results)
    bubble = compare_bubble(results, plan)
    bubble["activations"] = activation_report(results, plan, setup)
    return PipelineReport(
        strategy="pp", world_size=world_size, backend=backend, parity=compare(ours, reference), native=native,
        memory={"predicted": predicted_memory(setup, plan), "measured": results[0]["memory"]},
        comm={"predicted": {"isend": predicted_p2p_bytes(plan, setup)},  # rank 0, per step
              "measured": {op: b / setup.steps for op, b in results[0]["sent_bytes"].items() if b}},
        setup=setup.as_dict(), losses=ours.losses, schedule=bubble,
    )  # fmt: skip
