"""Predict: the pipeline schedules by name: checked, built as data with their messages, and their closed forms.

A pipeline cuts the model into ``p·v`` *virtual stages*; rank ``r`` holds the ``v`` chunks
``r, r + p, r + 2p, ...`` (v = 1: one contiguous stage per rank). One training step pushes ``m``
micro-batches through. A **schedule** is, for each rank, the ordered list of what it does:

    F(i, c)   forward of micro-batch i on its chunk c
    B(i, c)   backward (input and weight gradients; only the input gradient when split)
    W(i, c)   weight gradient (zero-bubble schedules split the backward into B and W)
    send/recv of activations (after F, before F) and of gradients (after B, before B)

The same :class:`Schedule` objects (``playbook.theory.pp.types``) drive the simulator
(``playbook.theory.pp.simulator.simulate``: timeline, bubble, peak in-flight activations) and the
executor on real ranks (``playbook.parallel.pp.run``). Sends never block (``isend``), receives do;
``simulate`` plays the lists with exactly these rules and matches every receive with its send, so a
schedule that would deadlock on real ranks raises ``Deadlock`` in ``make_schedule`` first. Each rank's
compute order comes from ``playbook.theory.pp.orders``; layers are cut into stages by
``playbook.theory.pp.layer_partition``.

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

- ZB-V and DualPipe-V (two chunks per rank in a V): ``playbook.theory.pp.v``; no closed
  form here, the simulator is their prediction.
- DualPipe (two directions, two copies of the parameters): ``playbook.theory.pp.dual``;
  simulated only (our executor holds one copy).

Two definitions of "bubble fraction" are in use; we always say which:
``idle_over_total`` = Σ_r idle_r / (p · makespan) (GPipe paper) and
``bubble_over_ideal`` = Σ_r idle_r / Σ_r busy_r (Narayanan et al.). For uniform costs the first is
x/(1+x) of the second, x = the second.

Pure Python; no torch. Times are in whatever unit the costs are given in (seconds on real ranks).
"""

from __future__ import annotations

from typing import Sequence

# equal_partition and held_bytes are re-exported for theory.pipeline, theory.local_activations and
# theory.hybrid (another change owns them); their homes are layer_partition and schedule_simulator.
from playbook.theory.pp.orders import _gpipe, _interleaved, _one_f_one_b, _zb_greedy, _zb_h1
from playbook.theory.pp.simulator import simulate
from playbook.theory.pp.types import Action, Schedule

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
VARIANTS = ("zb-h1-greedy",)  # built and played like the others, left out of the chapter's tables and the CLI
V_SCHEDULES = ("zb-v", "dualpipe-v")  # two chunks per rank in a V (playbook.theory.pp.v)
DEFINITIONS = {
    "idle_over_total": "idle time / (p × makespan), summed over ranks (GPipe's definition)",
    "bubble_over_ideal": "idle time / busy time, summed over ranks (Narayanan et al.'s definition)",
}


def chunks_per_rank(name: str, v: int) -> int:
    """Model chunks one pipeline rank holds under schedule ``name``: v interleaved, 2 on a V, else 1."""
    return v if name == "interleaved" else 2 if name in V_SCHEDULES else 1


def check_pipeline(p: int, m: int, v: int = 1, *, name: str = "1f1b", n_layers: int | None = None) -> None:
    """Raise ``ValueError`` naming the broken constraint and values that would work."""
    for label, value in (("p (pipeline stages)", p), ("m (micro-batches)", m), ("v (chunks per rank)", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    known = SCHEDULES + VARIANTS + V_SCHEDULES
    if name not in known:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(known)}")
    if name in V_SCHEDULES:
        from playbook.theory.pp.v import check_v

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
    pairs = None
    if name in V_SCHEDULES:
        from playbook.theory.pp.v import v_orders, v_pairs

        orders, pairs = v_orders(name, p, m), v_pairs(name, p, m)
    elif name not in ("gpipe", "1f1b", "interleaved", "zb-h1"):
        orders = _zb_greedy(p, m)
    placement = "v" if name in V_SCHEDULES else "loop"
    schedule = with_communication(name, p, m, v, is_split(name), orders, placement, pairs=pairs)
    simulate(schedule)  # raises if it does not play (deadlock, or a message never received)
    return schedule


def with_communication(
    name: str,
    p: int,
    m: int,
    v: int,
    split: bool,
    orders: Sequence[Sequence[tuple]],
    placement: str = "loop",
    *,
    pairs: Sequence[Sequence[int]] | None = None,
) -> Schedule:
    """Insert the point-to-point messages into per-rank compute orders ``[(kind, mb, chunk), ...]``:
    a receive right before each F (B) that needs another stage's activation (gradient), a send
    right after each F (B) whose result another stage needs (to the same rank where the V turns).
    ``pairs[r]``: positions in rank r's order of each F that opens an overlapped pair with the B (and
    its W) after it (DualPipe's F&B, ``theory.pp.v``): one unit, both receives before it and both sends
    after it, as DeepSeek's ``_forward_backward_chunk`` and torch's ``OVERLAP_F_B`` run it."""
    where = Schedule(name, p, m, v, split, (), placement)  # stage <-> (rank, chunk) only

    def recv(kind: str, mb: int, chunk: int, s: int) -> list[Action]:
        if kind == "F" and where.feeds(s - 1):
            return [Action("recv_F", mb, chunk, where.place(s - 1)[0])]
        if kind == "B" and where.feeds(s):
            return [Action("recv_B", mb, chunk, where.place(s + 1)[0])]
        return []

    def send(kind: str, mb: int, chunk: int, s: int) -> list[Action]:
        if kind == "F" and where.feeds(s):
            return [Action("send_F", mb, chunk, where.place(s + 1)[0])]
        if kind == "B" and where.feeds(s - 1):
            return [Action("send_B", mb, chunk, where.place(s - 1)[0])]
        return []

    actions = []
    for r, order in enumerate(orders):
        order, out, i = list(order), [], 0
        opens = set(pairs[r]) if pairs else set()
        while i < len(order):
            # one unit: a single action, or an overlapped pair F, B (and the W of that B right after it)
            n = 1
            if i in opens:
                if not (i + 1 < len(order) and order[i][0] == "F" and order[i + 1][0] == "B"):
                    raise ValueError(f"rank {r}: a pair opens at {order[i]} without a B after it")
                n = 3 if i + 2 < len(order) and order[i + 2] == ("W", *order[i + 1][1:]) else 2
            unit = [(kind, mb, chunk, where.stage(r, chunk)) for kind, mb, chunk in order[i : i + n]]
            out += [a for u in unit for a in recv(*u)]
            out += [Action(kind, mb, chunk) for kind, mb, chunk, _ in unit]
            out += [a for u in unit for a in send(*u)]
            i += n
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
