"""Predict: the V-shaped pipeline schedules, as data for ``playbook.theory.pp.schedules``.

The **V placement** cuts the model into 2p stages and gives rank r two chunks: chunk 0 is stage r
(going down the ranks), chunk 1 is stage 2p − 1 − r (coming back up). Rank 0 holds the first and
the last stage; the turn, stage p − 1 to stage p, stays on rank p − 1 (a message to itself). Each
rank then does the same work in every phase of the step, so no rank waits for the loss at the end
of the line, and the activations rank r holds are balanced: a micro-batch that entered early on
chunk 0 leaves chunk 1 of the same rank late, and vice versa.

- **ZB-V** (Qi et al. 2023, arXiv:2401.10241, §6 "ZB-V"): the split backward of ZB-H1 (B the
  input gradient, W the weights) on the V placement. Warm-up: 2(p − r) − 1 forwards of chunk 0,
  then r pairs (F chunk 1, F chunk 0), then p − r triples F, B, W on chunk 1; steady state:
  F B W on chunk 0, then on chunk 1; cool-down: r pairs of B (chunk 0, chunk 1) with their W
  held back, p − r pairs B, W on chunk 0, then the held-back W passes, chunk 1's first. With
  m < 2p − 1 the same order is built for 2p − 1 micro-batches and the missing ones dropped.
  With T_F = T_B = T_W every rank holds at most 2p chunk sets, p whole stages: 1F1B's rank 0.
- **DualPipe-V** (DeepSeek's DualPipe repository, ``dualpipe/dualpipev.py`` and its README: "a
  concise V-shape schedule derived from DualPipe using a 'cut-in-half' procedure", after Sea AI
  Lab's "Cut-in-half" post; DualPipe itself is DeepSeek-AI 2024, arXiv:2412.19437, §3.2.1): one copy
  of the parameters on the V placement, m >= 2p. Its steady state pairs a forward of one chunk
  with a *full* backward of the other (DualPipe's overlapped F&B: one chunk's all-to-all hides
  under the other's compute); only the end of the warm-up and the cool-down split B from W to
  fill holes. Phases for rank r: 2(p − r − 1) forwards of chunk 0; r + 1 pairs F0 F1; p − r − 1
  times B1 W F1; m − 2p + r + 1 times F0 with full B1, then F1 with full B0; p − r − 1 times full
  B1, then F1 with full B0; r + 1 pairs B1 B0, full in the first half and split after it (odd
  ranks switch before that iteration's B1, even ranks between B1 and B0); p − r − 1 times W and
  B0 (split); r + 1 remaining W passes, oldest first.

A full backward is written ``B`` then ``W`` right after it (so every schedule here splits, and
one micro-batch's W part is held for no time at all). An **overlapped pair** is one unit, as both
implementations run it: DeepSeek's ``_forward_backward_chunk`` receives the F's input and the B's
output-gradient, computes both, then sends both results; PyTorch 2.13's ``ScheduleDualPipeV`` builds
``OVERLAP_F_B`` actions whose sends follow both sub-actions. :func:`v_pairs` says where each pair
starts; ``theory.pp.schedules.with_communication`` posts both receives before the pair and both sends
after it. That costs idle time: paired, at T_F = T_B = T_W, DualPipe-V idles (p − 1)·T_F per rank
in chunk units, twice ZB-V's fill and as much as ZB-H1 (DualPipe's README formula
(PP/2 − 1)(F&B + B − 3W) exactly, with PP = 2p): the bubble it pays for the all-to-all it hides.
Our executor runs a pair's two parts one after the other, in that unit. PyTorch 2.13's
``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV`` build the same orders and pairs
(``playbook.parallel.pp.native.native_orders``, tests/theory/test_schedules_v.py).

Pure Python; no torch.
"""

from __future__ import annotations

V_NAMES = ("zb-v", "dualpipe-v")


def check_v(name: str, p: int, m: int, v: int) -> None:
    """Raise ``ValueError`` naming the constraint of a V schedule and what would work."""
    if v != 2:
        raise ValueError(
            f"{name!r} places exactly two chunks per rank (a V over 2p stages); use v=2 (--chunks 2 on the command line), got v={v}"
        )
    if name == "dualpipe-v" and m < 2 * p:
        raise ValueError(
            f"dualpipe-v needs at least as many micro-batches as stages, m >= 2p = {2 * p}; got m={m}; "
            f"try m in {{{', '.join(str(2 * p * k) for k in (1, 2, 3))}}}, or 'zb-v', which takes any m"
        )


class _Order:
    """One rank's compute order under construction: the next micro-batch of each (kind, chunk), and
    the W passes still owed (oldest first)."""

    def __init__(self) -> None:
        self.out: list[tuple[str, int, int]] = []
        self.next: dict[tuple[str, int], int] = {}
        self.owed: list[tuple[int, int]] = []  # (mb, chunk) whose B ran and whose W did not
        self.pairs: list[int] = []  # positions in ``out`` of each F that opens an overlapped F&B pair

    def count(self, kind: str, chunk: int) -> int:
        return self.next.get((kind, chunk), 0)

    def add(self, kind: str, chunk: int, *, full: bool = False, pair: bool = False) -> None:
        """Append the next F or B of ``chunk``; a B ``full`` is followed by its W at once, else it is owed;
        an F ``pair`` opens an overlapped pair with the full B added next (one unit, see the module docstring)."""
        mb = self.count(kind, chunk)
        if pair:
            self.pairs.append(len(self.out))
        self.next[(kind, chunk)] = mb + 1
        self.out.append((kind, mb, chunk))
        if kind == "B":
            if full:
                self.out.append(("W", mb, chunk))
            else:
                self.owed.append((mb, chunk))

    def pay(self, chunk: int | None = None) -> None:
        """Append the oldest owed W (of ``chunk`` if given); nothing if none is owed."""
        for k, (mb, c) in enumerate(self.owed):
            if chunk is None or c == chunk:
                self.owed.pop(k)
                self.out.append(("W", mb, c))
                return


def _zb_v(p: int, m: int, r: int) -> list[tuple[str, int, int]]:
    n = max(m, 2 * p - 1)  # enough micro-batches to fill the V; the extra ones are dropped below
    o = _Order()
    for _ in range(2 * (p - r) - 1):
        o.add("F", 0)
    for _ in range(r):
        o.add("F", 1)
        o.add("F", 0)
    for _ in range(p - r):
        o.add("F", 1)
        o.add("B", 1, full=True)
    while o.count("F", 0) < n or o.count("F", 1) < o.count("F", 0):
        if o.count("F", 0) < n:
            o.add("F", 0)
        o.add("B", 0, full=True)
        o.add("F", 1)
        o.add("B", 1, full=True)
    for _ in range(r):
        o.add("B", 0)
        o.add("B", 1)
    for _ in range(p - r):
        o.add("B", 0)
        o.pay(0)
    while any(c == 1 for _, c in o.owed):
        o.pay(1)
    while o.owed:
        o.pay(0)
    return [a for a in o.out if a[1] < m]


def _dualpipe_v(p: int, m: int, r: int) -> list[tuple[str, int, int]]:
    return _dualpipe_v_order(p, m, r).out


def _dualpipe_v_order(p: int, m: int, r: int) -> _Order:
    o = _Order()
    for _ in range(2 * (p - r - 1)):
        o.add("F", 0)
    for _ in range(r + 1):
        o.add("F", 0)
        o.add("F", 1)
    for _ in range(p - r - 1):
        o.add("B", 1)
        o.pay()
        o.add("F", 1)
    for i in range(m - 2 * p + r + 1):  # the overlapped pairs: F of one chunk with the full B of the other
        o.add("F", 0, pair=not (i == 0 and r == p - 1))  # DeepSeek: the last rank's first two are not overlapped
        o.add("B", 1, full=True)
        o.add("F", 1, pair=True)
        o.add("B", 0, full=True)
    for _ in range(p - r - 1):
        o.add("B", 1, full=True)
        o.add("F", 1, pair=True)
        o.add("B", 0, full=True)
    half = (r + 1) // 2
    for i in range(r + 1):  # from the middle on, B leaves its W for later to fill the cool-down
        o.add("B", 1, full=i < half or (i == half and r % 2 == 0))
        o.add("B", 0, full=i < half)
    for _ in range(p - r - 1):
        o.pay()
        o.add("B", 0)
    while o.owed:
        o.pay()
    return o


def v_pairs(name: str, p: int, m: int) -> list[list[int]]:
    """Per rank, the positions in :func:`v_orders`' order of each F that opens an overlapped F&B pair
    (DualPipe-V's; ZB-V has none)."""
    if name == "zb-v":
        return [[] for _ in range(p)]
    return [_dualpipe_v_order(p, m, r).pairs for r in range(p)]


def v_orders(name: str, p: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per-rank compute orders ``[(kind, mb, chunk), ...]`` of ``name`` on the V placement."""
    build = {"zb-v": _zb_v, "dualpipe-v": _dualpipe_v}[name]
    return [build(p, m, r) for r in range(p)]
