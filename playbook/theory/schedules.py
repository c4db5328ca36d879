"""Predict: pipeline schedules as data, and a simulator that plays them.

A pipeline cuts the model into ``p·v`` *virtual stages*; rank ``r`` holds the ``v`` chunks
``r, r + p, r + 2p, ...`` (v = 1: one contiguous stage per rank). One training step pushes ``m``
micro-batches through. A **schedule** is, for each rank, the ordered list of what it does:

    F(i, c)   forward of micro-batch i on its chunk c
    B(i, c)   backward (input and weight gradients; only the input gradient when split)
    W(i, c)   weight gradient (zero-bubble schedules split the backward into B and W)
    send/recv of activations (after F, before F) and of gradients (after B, before B)

The same :class:`Schedule` objects drive the simulator here (``simulate``: timeline, bubble, peak
in-flight activations) and the executor on real ranks (``playbook.parallel.pp.pipeline``). Sends never
block (``isend``), receives do; ``simulate`` plays the lists with exactly these rules and matches
every receive with its send, so a schedule that would deadlock on real ranks raises
:class:`Deadlock` here first.

Closed forms, for uniform costs T_F, T_B, T_W per stage (the tests check the simulator against them):

- GPipe (Huang et al. 2019, arXiv:1811.06965): all forwards, then all backwards.
  idle / total = (p−1)/(m+p−1); bubble / ideal = (p−1)/m. Holds m micro-batches of activations.
- 1F1B (PipeDream-Flush; Narayanan et al. 2021, arXiv:2104.04473, §2.2): the same bubble, but
  rank r holds at most min(p−r, m) micro-batches (warm-up of p−r−1 forwards, then one F one B).
- Interleaved 1F1B with v chunks per rank (Narayanan et al. §2.2.2): bubble / ideal =
  (p−1)/(v·m), m a multiple of p; rank 0 holds p·(1 + (p−1)/(p·v)) stages' worth of activations
  (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.3); v× the point-to-point messages.
- ZB-H1 (Qi et al. 2023, arXiv:2401.10241, §2.1 and Table 2): bubble time per rank
  (p−1)(T_F+T_B−T_W) instead of 1F1B's (p−1)(T_F+T_B+T_W), and no rank holds more than p
  micro-batches (1F1B's peak, p·M_B): rank r delays its W passes by r micro-batches.

- ZB-V and DualPipe-V (two chunks per rank in a V): ``playbook.theory.schedules_v``; no closed
  form here, the simulator is their prediction.
- DualPipe (two directions, two copies of the parameters): ``playbook.theory.schedules_dual``;
  simulated only (our executor holds one copy).

Two definitions of "bubble fraction" are in use; we always say which:
``idle_over_total`` = Σ_r idle_r / (p · makespan) (GPipe paper) and
``bubble_over_ideal`` = Σ_r idle_r / Σ_r busy_r (Narayanan et al.). For uniform costs the first is
x/(1+x) of the second, x = the second.

Pure Python; no torch. Times are in whatever unit the costs are given in (seconds on real ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
VARIANTS = ("zb-h1-greedy",)  # built and played like the others, left out of the chapter's tables and the CLI
V_SCHEDULES = ("zb-v", "dualpipe-v")  # two chunks per rank in a V (playbook.theory.schedules_v)
DEFINITIONS = {
    "idle_over_total": "idle time / (p × makespan), summed over ranks (GPipe's definition)",
    "bubble_over_ideal": "idle time / busy time, summed over ranks (Narayanan et al.'s definition)",
}


@dataclass(frozen=True)
class Action:
    """One entry of a rank's list. ``kind``: F, B, W, send_F, recv_F, send_B, recv_B.
    ``mb`` the micro-batch, ``chunk`` this rank's model chunk, ``peer`` the other rank (comm only)."""

    kind: str
    mb: int
    chunk: int = 0
    peer: int = -1

    @property
    def is_compute(self) -> bool:
        return self.kind in ("F", "B", "W")

    def __str__(self) -> str:
        where = f".{self.chunk}" if self.chunk else ""
        return f"{self.kind}{self.mb}{where}" + (f"@{self.peer}" if self.peer >= 0 else "")


@dataclass(frozen=True)
class Schedule:
    """What every rank does in one step. ``actions[r]``: rank r's list, compute and comm."""

    name: str
    p: int
    m: int
    v: int
    split_backward: bool  # True: B is the input gradient only, W the weight gradient
    actions: tuple[tuple[Action, ...], ...]
    placement: str = "loop"  # "loop": chunk c of rank r is stage c·p + r; "v": chunk 0 stage r, chunk 1 2p−1−r
    # "dual" (DualPipe, playbook.theory.schedules_dual): numbered as "v", but two chains of p stages

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    def stage(self, rank: int, chunk: int) -> int:
        """Virtual stage of ``chunk`` on ``rank`` (Megatron's placement: chunk c of rank r is stage c·p + r;
        the V placement: chunk 0 is stage r, chunk 1 stage 2p − 1 − r)."""
        if self.placement in ("v", "dual"):
            return rank if chunk == 0 else 2 * self.p - 1 - rank
        return chunk * self.p + rank

    def feeds(self, stage: int) -> bool:
        """Whether virtual stage ``stage`` sends its activations to ``stage + 1`` (DualPipe: not
        from the end of direction 0, stage p − 1, to the entry of direction 1, stage p)."""
        return 0 <= stage < self.n_stages - 1 and not (self.placement == "dual" and stage == self.p - 1)

    def pairs(self) -> set[tuple[int, int]]:
        """Every (micro-batch, chunk) a rank runs: each micro-batch on each chunk (DualPipe: the
        first half of the micro-batches on chunk 0, going down, the second half on chunk 1)."""
        if self.placement == "dual":
            half = self.m // 2
            return {(i, int(i >= half)) for i in range(self.m)}
        return {(i, c) for i in range(self.m) for c in range(self.v)}

    def place(self, stage: int) -> tuple[int, int]:
        """(rank, chunk) that holds virtual stage ``stage``."""
        if self.placement in ("v", "dual"):
            return (stage, 0) if stage < self.p else (2 * self.p - 1 - stage, 1)
        return stage % self.p, stage // self.p

    def compute(self, rank: int) -> list[Action]:
        return [a for a in self.actions[rank] if a.is_compute]

    def table(self) -> list[str]:
        """One line per rank with its compute order, e.g. ``rank 0: F0 F1 B0 F2 B1 ...``."""
        return [f"rank {r}: " + " ".join(str(a) for a in self.compute(r)) for r in range(self.p)]


# ---- generators: the compute order of one rank ------------------------------------------------
def _gpipe(p: int, m: int, r: int) -> list[tuple]:
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


def _one_f_one_b(p: int, m: int, r: int) -> list[tuple]:
    warm = min(p - r - 1, m)  # forwards before the first backward
    order = [("F", i, 0) for i in range(warm)]
    for i in range(m - warm):  # steady state: one forward, one backward
        order += [("F", warm + i, 0), ("B", i, 0)]
    return order + [("B", i, 0) for i in range(m - warm, m)]


def _interleaved(p: int, m: int, v: int, r: int) -> list[tuple]:
    """Megatron-LM's interleaved 1F1B: micro-batches go through the chunks in groups of p."""

    def which(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // p) % v
        return (k // (p * v)) * p + k % p, (v - 1 - chunk if backward else chunk)

    total = m * v
    # Megatron's warm-up: (v−1)·p forwards to fill the other chunks, plus 2(p−r−1) (twice 1F1B's, so
    # that each rank's sends and receives can overlap); it sets rank 0's memory, p(1 + (p−1)/(p·v)) stages
    warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    order = [("F", *which(k, False)) for k in range(warm)]
    for k in range(total - warm):
        order += [("F", *which(warm + k, False)), ("B", *which(k, True))]
    return order + [("B", *which(k, True)) for k in range(total - warm, total)]


def _zb_h1(p: int, m: int, r: int) -> list[tuple]:
    """ZB-H1 as Qi et al. 2023 (arXiv:2401.10241, §2.1, Figure 3) schedule it: 1F1B's order of F and
    B (warm-up of p − r − 1 forwards), each B followed by a W, with rank r's W passes delayed by r
    micro-batches (rank 0 runs W right after each B, the last rank p − 1 of them later). The delay
    fills the holes 1F1B leaves before each rank's first B, while F done and W not yet stays at
    (p − r) + r = p sets on every rank: 1F1B's peak (rank 0's), with the r W-only sets (small, §2)
    in place of full ones. Bubble per rank (p−1)(T_F+T_B−T_W) for m >= p (tests/test_schedules.py)."""
    warm = min(p - r - 1, m)
    order: list[tuple] = [("F", i, 0) for i in range(warm)]
    done_w = 0

    def backward(i: int) -> None:
        nonlocal done_w
        order.append(("B", i, 0))
        if i - done_w >= r:  # the W of micro-batch i − r
            order.append(("W", done_w, 0))
            done_w += 1

    for i in range(m - warm):  # steady state: F, B, and the delayed W
        order.append(("F", warm + i, 0))
        backward(i)
    for i in range(m - warm, m):  # cool-down
        backward(i)
    return order + [("W", i, 0) for i in range(done_w, m)]


def _zb_greedy(p: int, m: int) -> list[list[tuple]]:
    """A greedy list schedule with a split backward (``"zb-h1-greedy"``; not the paper's ZB-H1): play
    the pipeline with unit costs and let each rank, whenever it is free, pick
    B (the input gradient: it is on the critical path back to rank 0) over F (allowed while fewer
    than p − r forwards are in flight on rank r, 1F1B's activation bound) over W (the weight
    gradient, which nothing waits for and so fills the gaps); once p W passes are waiting, W goes
    first. The recorded per-rank orders are the schedule. Its bubble equals ZB-H1's for m >= p, but
    deferring every W as late as it can keeps up to 2p − 1 − r sets on rank r until their W
    (7, 6, 5, 4 at p = 4, m = 8, against ZB-H1's 4 on every rank): where the W passes go is a
    memory decision, and Qi et al.'s order (``_zb_h1``) takes the one that costs nothing."""
    orders: list[list[tuple]] = [[] for _ in range(p)]
    free = [0.0] * p
    f_ready = [dict.fromkeys(range(m), 0.0)] + [{} for _ in range(p - 1)]  # mb -> input there at
    b_ready: list[dict] = [{} for _ in range(p)]  # mb -> gradient there at
    next_f, next_b, waiting_w = [0] * p, [0] * p, [[] for _ in range(p)]
    for _ in range(3 * m * p):
        best = None
        for r in range(p):
            options = []
            if next_b[r] < m and next_b[r] in b_ready[r]:
                options.append((max(free[r], b_ready[r][next_b[r]]), 1, "B", next_b[r]))
            if next_f[r] < m and next_f[r] - next_b[r] < p - r and next_f[r] in f_ready[r]:
                options.append((max(free[r], f_ready[r][next_f[r]]), 2, "F", next_f[r]))
            if waiting_w[r]:
                options.append((free[r], 0 if len(waiting_w[r]) >= p else 3, "W", waiting_w[r][0]))
            if options:
                start, _, kind, mb = min(options)
                if best is None or start < best[0]:
                    best = (start, r, kind, mb)
        start, r, kind, mb = best
        free[r] = start + 1.0
        orders[r].append((kind, mb, 0))
        if kind == "F":
            next_f[r] += 1
            (f_ready[r + 1] if r < p - 1 else b_ready[r])[mb] = free[r]
        elif kind == "B":
            next_b[r] += 1
            waiting_w[r].append(mb)
            if r > 0:
                b_ready[r - 1][mb] = free[r]
        else:
            waiting_w[r].pop(0)
    return orders


def check_pipeline(p: int, m: int, v: int = 1, *, name: str = "1f1b", n_layers: int | None = None) -> None:
    """Raise ``ValueError`` naming the broken constraint and values that would work."""
    for label, value in (("p (pipeline stages)", p), ("m (micro-batches)", m), ("v (chunks per rank)", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    known = SCHEDULES + VARIANTS + V_SCHEDULES
    if name not in known:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(known)}")
    if name in V_SCHEDULES:
        from playbook.theory.schedules_v import check_v

        check_v(name, p, m, v)
    elif v > 1 and name != "interleaved":
        raise ValueError(f"v={v} chunks per rank needs the 'interleaved' schedule; use v=1 with {name!r}")
    if name == "interleaved" and m % p:
        good = [k * p for k in range(1, 5)]
        raise ValueError(
            f"interleaved 1F1B sends micro-batches through the chunks in groups of p={p}, so m must be "
            f"a multiple of p; got m={m}; try m in {{{', '.join(map(str, good))}}}"
        )
    if n_layers is not None and p * v > n_layers + 2:
        raise ValueError(
            f"{p * v} stages (p={p} × v={v}) but the model has only {n_layers} layers plus the embedding "
            f"and the head ({n_layers + 2} pieces to place); use p·v <= {n_layers + 2}, or a deeper model "
            f"(PipelineSetup(n_layers=...), --layers on the command line)"
        )


def is_split(name: str) -> bool:
    """Whether schedule ``name`` splits the backward into B (input gradient) and W (weights)."""
    return name.startswith("zb-") or name in V_SCHEDULES


def make_schedule(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """The schedule ``name`` (gpipe, 1f1b, interleaved, zb-h1, the variant zb-h1-greedy, or the V-shaped
    zb-v and dualpipe-v with v = 2) for p ranks, m micro-batches and v chunks per rank, with its
    sends and receives; checked by playing it (``simulate``)."""
    check_pipeline(p, m, v, name=name)
    if name == "gpipe":
        orders = [_gpipe(p, m, r) for r in range(p)]
    elif name == "1f1b" or (name == "interleaved" and v == 1):
        orders = [_one_f_one_b(p, m, r) for r in range(p)]
    elif name == "interleaved":
        orders = [_interleaved(p, m, v, r) for r in range(p)]
    elif name == "zb-h1":
        orders = [_zb_h1(p, m, r) for r in range(p)]
    elif name in V_SCHEDULES:
        from playbook.theory.schedules_v import v_orders

        orders = v_orders(name, p, m)
    else:
        orders = _zb_greedy(p, m)
    placement = "v" if name in V_SCHEDULES else "loop"
    schedule = with_communication(name, p, m, v, is_split(name), orders, placement)
    simulate(schedule)  # raises if it does not play (deadlock, or a message never received)
    return schedule


def with_communication(
    name: str, p: int, m: int, v: int, split: bool, orders: Sequence[Sequence[tuple]], placement: str = "loop"
) -> Schedule:
    """Insert the point-to-point messages into per-rank compute orders ``[(kind, mb, chunk), ...]``:
    a receive right before each F (B) that needs another stage's activation (gradient), a send
    right after each F (B) whose result another stage needs (to the same rank where the V turns)."""
    where = Schedule(name, p, m, v, split, (), placement)  # stage <-> (rank, chunk) only
    actions = []
    for r, order in enumerate(orders):
        out: list[Action] = []
        for kind, mb, chunk in order:
            s = where.stage(r, chunk)
            if kind == "F" and where.feeds(s - 1):
                out.append(Action("recv_F", mb, chunk, where.place(s - 1)[0]))
            if kind == "B" and where.feeds(s):
                out.append(Action("recv_B", mb, chunk, where.place(s + 1)[0]))
            out.append(Action(kind, mb, chunk))
            if kind == "F" and where.feeds(s):
                out.append(Action("send_F", mb, chunk, where.place(s + 1)[0]))
            if kind == "B" and where.feeds(s - 1):
                out.append(Action("send_B", mb, chunk, where.place(s - 1)[0]))
        actions.append(tuple(out))
    schedule = Schedule(name, p, m, v, split, tuple(actions), placement)
    validate(schedule)
    return schedule


def validate(schedule: Schedule) -> None:
    """Every (micro-batch, chunk) has exactly one F, one B (and one W when split) on every rank, in that order."""
    need = ("F", "B", "W") if schedule.split_backward else ("F", "B")
    for r in range(schedule.p):
        seen: dict[tuple[int, int], list[str]] = {}
        for a in schedule.compute(r):
            if a.kind not in need:
                raise ValueError(f"rank {r}: {a} is not allowed in a schedule with kinds {need}")
            seen.setdefault((a.mb, a.chunk), []).append(a.kind)
        want = schedule.pairs()
        if set(seen) != want:
            raise ValueError(f"rank {r}: missing (micro-batch, chunk) pairs {sorted(want - set(seen))}")
        for key, kinds in seen.items():
            if kinds != list(need):
                raise ValueError(
                    f"rank {r}: micro-batch {key[0]} chunk {key[1]} runs {kinds}, expected {list(need)} in order"
                )


# ---- the simulator -----------------------------------------------------------------------------
class Deadlock(RuntimeError):
    """The schedule cannot finish: every remaining rank waits for a message nobody will send."""


@dataclass(frozen=True)
class Costs:
    """Seconds (or any unit) per action: ``f``, ``b``, ``w`` each a number (every stage alike) or a
    sequence with one entry per virtual stage. A schedule whose backward is not split pays b + w for
    B. ``send``: time the sending rank spends issuing a message; ``comm``: from the moment both the
    send is issued and the receive is posted to the receive returning (a rendezvous, as gloo's
    point-to-point behaves: the payload moves once the receiver has asked for it)."""

    f: float | Sequence[float] = 1.0
    b: float | Sequence[float] = 1.0
    w: float | Sequence[float] = 1.0
    comm: float = 0.0
    send: float = 0.0

    def of(self, kind: str, stage: int, split: bool) -> float:
        def at(x):
            return float(x[stage]) if isinstance(x, (list, tuple)) else float(x)

        if kind == "F":
            return at(self.f)
        if kind == "B":
            return at(self.b) if split else at(self.b) + at(self.w)
        return at(self.w)


@dataclass(frozen=True)
class Slot:
    """One compute action on the timeline (the same shape as a measured one from the executor)."""

    rank: int
    kind: str
    mb: int
    chunk: int
    start: float
    end: float


@dataclass
class Timeline:
    """What ``simulate`` (or a real run, see ``Timeline.from_slots``) gives: every compute slot, and
    derived from them the makespan, busy time per rank and the bubble in both definitions."""

    p: int
    slots: list[Slot]
    peak_in_flight: list[int] = field(default_factory=list)  # micro-batch chunks F done, B not yet
    peak_held: list[int] = field(default_factory=list)  # F done, activations not yet freed (B, or W if split)

    @property
    def start(self) -> float:
        return min(s.start for s in self.slots)

    @property
    def makespan(self) -> float:
        return max(s.end for s in self.slots) - self.start

    def busy(self) -> list[float]:
        out = [0.0] * self.p
        for s in self.slots:
            out[s.rank] += s.end - s.start
        return out

    def idle(self) -> list[float]:
        return [self.makespan - b for b in self.busy()]

    @property
    def bubble_over_total(self) -> float:
        return sum(self.idle()) / (self.p * self.makespan)

    @property
    def bubble_over_ideal(self) -> float:
        return sum(self.idle()) / sum(self.busy())

    def bubble(self) -> dict[str, float]:
        return {"idle_over_total": self.bubble_over_total, "bubble_over_ideal": self.bubble_over_ideal}

    def mean_cost(self, kind: str, rank: int | None = None) -> float:
        xs = [s.end - s.start for s in self.slots if s.kind == kind and (rank is None or s.rank == rank)]
        return sum(xs) / len(xs) if xs else 0.0


def simulate(schedule: Schedule, costs: Costs | None = None) -> Timeline:
    """Play ``schedule`` with ``costs``: each rank runs its list in order; a send costs its rank
    ``costs.send``; a receive returns ``costs.comm`` after the later of its posting and its send. Raises
    :class:`Deadlock` (what each stuck rank waits for) if the lists cannot finish, and
    ``ValueError`` if a message is sent and never received."""
    costs = costs or Costs()
    p, split = schedule.p, schedule.split_backward
    arrived: dict[tuple[str, int, int], float] = {}  # (F|B, micro-batch, receiving stage) -> time
    received: set[tuple[str, int, int]] = set()
    free = [0.0] * p
    at = [0] * p
    slots: list[Slot] = []
    moved = True
    while moved:
        moved = False
        for r in range(p):
            acts = schedule.actions[r]
            while at[r] < len(acts):
                a = acts[at[r]]
                s = schedule.stage(r, a.chunk)
                if a.kind.startswith("recv"):
                    key = (a.kind[-1], a.mb, s)
                    if key not in arrived:
                        break  # blocked: come back when the sender got further
                    free[r] = max(free[r], arrived[key]) + costs.comm  # both sides ready, then the transfer
                    received.add(key)
                elif a.kind.startswith("send"):
                    to = s + 1 if a.kind == "send_F" else s - 1
                    arrived[(a.kind[-1], a.mb, to)] = free[r]
                    free[r] += costs.send
                else:
                    t = costs.of(a.kind, s, split)
                    slots.append(Slot(r, a.kind, a.mb, a.chunk, free[r], free[r] + t))
                    free[r] += t
                at[r] += 1
                moved = True
    stuck = {r: schedule.actions[r][at[r]] for r in range(p) if at[r] < len(schedule.actions[r])}
    if stuck:
        lines = ", ".join(f"rank {r} waits in {a}" for r, a in stuck.items())
        raise Deadlock(f"schedule {schedule.name!r} (p={p}, m={schedule.m}, v={schedule.v}) deadlocks: {lines}")
    if set(arrived) != received:
        raise ValueError(f"messages sent but never received: {sorted(set(arrived) - received)[:5]}")
    return Timeline(p, slots, *in_flight(schedule))


def in_flight(schedule: Schedule) -> tuple[list[int], list[int]]:
    """Peak number of (micro-batch, chunk) activation sets alive on each rank, from the order alone:
    (F done and B not yet, F done and the activations not yet freed — after B, or after W when the
    backward is split and W still needs them)."""
    until_b, held = [], []
    for r in range(schedule.p):
        n_b = n_h = peak_b = peak_h = 0
        for a in schedule.compute(r):
            if a.kind == "F":
                n_b, n_h = n_b + 1, n_h + 1
            elif a.kind == "B":
                n_b -= 1
                n_h -= 0 if schedule.split_backward else 1
            else:
                n_h -= 1
            peak_b, peak_h = max(peak_b, n_b), max(peak_h, n_h)
        until_b.append(peak_b)
        held.append(peak_h)
    return until_b, held


def held_bytes(
    schedule: Schedule, chunk_bytes: Sequence[Sequence[int]], w_bytes: Sequence[Sequence[int]] | None = None
) -> list[int]:
    """Peak bytes of saved activations per rank, playing the order: + ``chunk_bytes[r][c]`` at each
    F of chunk c, − at its B. With a split backward, ``w_bytes[r][c]`` of them stay from B until
    that micro-batch's W (Qi et al. 2023, §2: W needs only each linear's input and output gradient);
    ``w_bytes=None``: the whole set stays until W."""
    split = schedule.split_backward
    out = []
    for r in range(schedule.p):
        now = peak = 0
        for a in schedule.compute(r):
            whole = chunk_bytes[r][a.chunk]
            w = (whole if w_bytes is None else w_bytes[r][a.chunk]) if split else 0
            now += {"F": whole, "B": w - whole, "W": -w}[a.kind]
            peak = max(peak, now)
        out.append(peak)
    return out


# ---- closed forms ------------------------------------------------------------------------------
def closed_form(name: str, p: int, m: int, v: int = 1, *, f: float = 1.0, b: float = 1.0, w: float = 1.0) -> dict:
    """Bubble (both definitions) and peak in-flight micro-batches on rank 0, from the papers'
    formulas (module docstring), for per-stage costs f, b, w of a whole stage (a chunk costs 1/v)."""
    check_pipeline(p, m, v, name=name)
    if name in V_SCHEDULES:
        raise ValueError(
            f"{name!r} has no closed form here; simulate(make_schedule({name!r}, p, m, 2)) gives its bubble"
        )
    step = f + b + w
    if name.startswith("zb-h1"):
        idle = (p - 1) * (f + b - w)
    elif name == "interleaved":
        idle = (p - 1) * step / v
    else:
        idle = (p - 1) * step
    x = idle / (m * step)
    if name == "gpipe":
        peak = m
    elif name == "interleaved" and v > 1:
        peak = min((p - 1) * 2 + (v - 1) * p + 1, m * v)  # chunks: p·(1 + (p−1)/(p·v)) stages' worth when m is large
    else:
        peak = min(p, m)
    return {"bubble_over_ideal": x, "idle_over_total": x / (1 + x), "peak_in_flight_rank0": peak}


# ---- placing layers on stages ------------------------------------------------------------------
def balanced_partition(weights: Sequence[float], parts: int) -> list[tuple[int, int]]:
    """Cut ``weights`` (one per layer, in order) into ``parts`` contiguous non-empty ranges
    [start, end) minimising the heaviest part (dynamic programming, exact). Use measured time per
    layer for speed, or bytes per layer for memory."""
    n = len(weights)
    if parts < 1 or parts > n:
        raise ValueError(f"cannot cut {n} layers into {parts} non-empty stages; use 1 <= stages <= {n}")
    prefix = [0.0]
    for x in weights:
        prefix.append(prefix[-1] + float(x))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]  # best[k][j]: first j layers in k parts
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            for i in range(k - 1, j):
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j] - 1e-15:
                    best[k][j], cut[k][j] = cost, i
    ranges, j = [], n
    for k in range(parts, 0, -1):
        ranges.append((cut[k][j], j))
        j = cut[k][j]
    return ranges[::-1]


def equal_partition(n_layers: int, parts: int) -> list[tuple[int, int]]:
    """The naive cut: transformer blocks split as evenly as possible, the embedding (piece 0) added to
    the first stage and the head (piece n_layers + 1) to the last; ranges over the n_layers + 2 pieces."""
    if parts > n_layers + 2:
        raise ValueError(
            f"{parts} stages but only {n_layers} layers plus embedding and head; use stages <= {n_layers + 2}"
        )
    if parts > n_layers:  # too few blocks: give embedding and head stages of their own where needed
        return balanced_partition([1.0] * (n_layers + 2), parts)
    base, extra = divmod(n_layers, parts)
    ranges, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0) + (1 if k == 0 else 0) + (1 if k == parts - 1 else 0)
        ranges.append((start, start + size))
        start += size
    return ranges
