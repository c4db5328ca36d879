"""Pipeline schedules the planner searches, and the bubble each costs (pure arithmetic, no torch).

The bubble is given over the ideal time (compute and exposed per-micro-batch communication of the
m micro-batches), with a stage's backward twice its forward, split evenly into B (input gradient)
and W (weights) where a schedule splits it:

- **1f1b** (Narayanan et al. 2021, arXiv:2104.04473, §2.2): (p − 1)/m.
- **interleaved** with v model chunks per stage (§2.2.2): (p − 1)/(v·m); m a multiple of p, and
  p·v ≤ the layers. Its first stage holds 1 + (p − 1)/(p·v) times 1F1B's activations
  (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.3; ``theory.plan.memory.in_flight``), and every
  micro-batch crosses v times as many stage boundaries.
- **zb-h1** (Qi et al. 2023, arXiv:2401.10241, §3): (p − 1)(F + B − W)/(m·(F + B + W)) = (p − 1)/(3m)
  with F = B = W, at 1F1B's memory.
- **zb-v** (Qi et al. §6): two chunks per rank in a V, m ≥ 2p: (p − 1)/(6m), each rank idle
  (p − 1)/2 chunk-forwards in fill and drain; zero inside the step, as the paper's condition says.
- **dualpipe-v** (DeepSeek's DualPipe repository, after Sea AI Lab's "cut-in-half"): the same V with
  its overlapped F&B pairs each one unit (both inputs received before the pair, both outputs sent
  after it: ``theory.pp.v``): (p − 1)/(3m), twice ZB-V's, as much as ZB-H1, DualPipe's README formula
  at F = B = W. What it buys is the all-to-all hidden under the pair, which the overlap presets of
  ``theory.plan.cost`` credit; with nothing to hide ZB-V dominates it. Both are what
  ``theory.pp.schedules.simulate`` gives at F = B = W (the test plays them). Rank 0 holds p stages'
  worth, 1F1B's peak.

``closed_form`` is chapter 4's (``theory.pp.schedules``), not copies.

Stage ends (``ENDS``): "even" spreads the layers over the p·v virtual stages, the first ones taking
the remainder; "light" puts one layer fewer on the first and the last virtual stage, as Llama 3 does
to balance the embedding and the warm-up micro-batches of the first stage and the output and loss of
the last (Dubey et al. 2024, arXiv:2407.21783, §3.3.2: "the first model chunk on the first stage has
only the embedding, and the last model chunk on the last stage has only output projection and loss
calculation"). With uneven stages the most loaded rank need not be the first: :func:`layers_held`
plays chapter 4's order of each rank and counts the layers' activations held at once.
"""

from __future__ import annotations

import functools

from playbook.theory.pp.orders import _interleaved, _one_f_one_b
from playbook.theory.pp.schedules import V_SCHEDULES, check_pipeline, chunks_per_rank, closed_form

PLAN_SCHEDULES = ("1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v")
V_CHOICES = (2, 3, 4, 6, 8, 12)  # chunks per stage tried interleaved: published runs used up to 12 (issue 41)
ENDS = ("even", "light")  # layers per virtual stage (module docstring)


def check_schedules(schedules) -> tuple[str, ...]:
    """The schedules as a tuple, or one line naming the known ones."""
    bad = [s for s in schedules if s not in PLAN_SCHEDULES]
    if bad or not schedules:
        raise ValueError(f"schedules must be among {', '.join(PLAN_SCHEDULES)}; got {', '.join(bad) or 'none'}")
    return tuple(schedules)


def schedule_options(p: int, m: int, n_layers: int, schedules=PLAN_SCHEDULES) -> list[tuple[str, int]]:
    """(schedule, v) pairs a pipeline of p stages and m micro-batches can run (pp = 1: none but 1f1b)."""
    if p == 1:
        return [("1f1b", 1)]
    out = []
    for name in schedules:
        if name == "interleaved":
            out += [(name, v) for v in V_CHOICES if m % p == 0 and p * v <= n_layers]
        elif name in V_SCHEDULES:
            if m >= 2 * p and 2 * p <= n_layers:
                out.append((name, 2))
        else:
            out.append((name, 1))
    return out


@functools.lru_cache(maxsize=4096)
def bubble_fraction(name: str, p: int, m: int, v: int = 1) -> float:
    """Bubble over the ideal pipelined time (module docstring)."""
    if p == 1:
        return 0.0
    if name == "zb-v":
        return (p - 1) / (6 * m)
    if name == "dualpipe-v":
        return (p - 1) / (3 * m)  # its overlapped pairs are units (module docstring)
    if name == "1f1b":
        return (p - 1) / m
    f, b, w = (1.0, 2.0, 0.0) if name != "zb-h1" else (1.0, 1.0, 1.0)
    return closed_form(name, p, m, v, f=f, b=b, w=w)["bubble_over_ideal"]


def stage_placement(name: str) -> str:
    """The stage placement schedule ``name`` uses, which sets the data axis's most loaded rank
    (``theory.plan.axis_bytes.dp_groups``): "zb-v" for either V shape (both put rank r's two chunks on stages r
    and 2p − 1 − r, ``theory.pp.rank_params.chunk_ranges``), "1f1b" for the rest: one name per placement,
    so a search costs each once."""
    return V_SCHEDULES[0] if name in V_SCHEDULES else "1f1b"


def boundary_crossings(name: str, v: int) -> int:
    """Stage boundaries one micro-batch crosses per direction, in units of the p − 1 of 1F1B: one per
    chunk a rank holds (:func:`chunks_per_rank`), v interleaved, 2 on a V (down and back up; the
    turn stays on one rank)."""
    return chunks_per_rank(name, v)


def chunk_layers(n_layers: int, p: int, v: int = 1, ends: str = "even") -> tuple[int, ...]:
    """Layers of each virtual stage 0 … p·v − 1 (stage c·p + r is chunk c of rank r), by ``ends``
    (module docstring): "light" spreads L + 2 and takes one back from the first and the last."""
    if ends not in ENDS:
        raise ValueError(f"ends must be one of {', '.join(ENDS)}; got {ends!r}")
    n, total = p * v, n_layers + 2 * (ends == "light")
    if total < n or (ends == "light" and n < 2):
        raise ValueError(f"{n_layers} layers do not make {n} virtual stages with {ends} ends; use fewer p·v")
    base, extra = divmod(total, n)
    sizes = [base + (i < extra) for i in range(n)]
    if ends == "light":
        sizes[0], sizes[-1] = sizes[0] - 1, sizes[-1] - 1
    return tuple(sizes)


@functools.lru_cache(maxsize=1024)
def layers_held(name: str, p: int, m: int, v: int, layers: tuple[int, ...]) -> tuple[int, ...]:
    """Per rank, the most layer·micro-batches of activations alive at once: rank r's compute order
    (chapter 4's ``theory.pp.schedules``: Megatron's warm-up, then one forward and one backward) played
    with ``layers`` (:func:`chunk_layers`) per virtual stage; a backward frees its chunk's layers."""
    if name not in ("1f1b", "interleaved"):
        raise ValueError(f"uneven stages are counted for 1f1b and interleaved; got {name!r}")
    check_pipeline(p, m, v, name=name)  # chapter 4's rules: m a multiple of p when interleaved, ...
    out = []
    for r in range(p):
        order = _interleaved(p, m, v, r) if name == "interleaved" and v > 1 else _one_f_one_b(p, m, r)
        held = peak = 0
        for kind, _, chunk in order:
            held += layers[chunk * p + r] if kind == "F" else -layers[chunk * p + r]
            peak = max(peak, held)
        out.append(peak)
    return tuple(out)
