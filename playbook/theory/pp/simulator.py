"""Predict: play a pipeline :class:`~playbook.theory.pp.types.Schedule` with given costs, the
rules of the executor on real ranks (sends never block, receives do, a message moves once both
sides are ready): the :class:`Timeline` (every compute slot, makespan, bubble in both definitions),
:class:`Deadlock` if the lists cannot finish, and the activation sets and bytes each rank holds
at its peak (``in_flight``, ``held_bytes``). A measured run gives a :class:`Timeline` of the same
shape (``playbook.measure.pipeline``).

Pure Python; no torch. Times are in whatever unit the costs are given in (seconds on real ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from playbook.theory.pp.types import Schedule


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

    def idle_parts(self) -> list[dict[str, float]]:
        """Each rank's idle time split where it falls: before its first slot (``start``), after its last
        (``end``) and between slots (``inside``). Only ``inside`` is a bubble that consecutive steps
        cannot fill: with no synchronisation between steps (Qi et al. 2023, arXiv:2401.10241, §4:
        post-validation instead of the optimizer's all-reduce) the next step starts into a rank's end."""
        t0, t1 = self.start, self.start + self.makespan
        out = []
        for r, idle in enumerate(self.idle()):
            mine = [s for s in self.slots if s.rank == r]
            first, last = min(s.start for s in mine), max(s.end for s in mine)
            out.append({"start": first - t0, "end": t1 - last, "inside": idle - (first - t0) - (t1 - last)})
        return out

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
