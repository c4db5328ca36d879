"""Predict: DualPipe, the bidirectional pipeline, as data for ``playbook.theory.pp.schedules``.

DualPipe (DeepSeek-AI 2024, the DeepSeek-V3 technical report, arXiv:2412.19437, §3.2.1) cuts the
model into p stages and holds **two copies** of it: micro-batches of the first half of the step
enter at rank 0 and flow down (direction 0: rank r runs stage r), those of the second half enter
at rank p − 1 and flow up (direction 1: rank r runs stage p − 1 − r). Every rank therefore holds
two whole stages, twice the parameters of 1F1B (and their gradients, summed between the two copies
after the step); p must be even and m >= 2p, half of the micro-batches in each direction.

The order: seen from rank r, the direction in which it sits ``h = min(r, p − 1 − r)`` stages from
the entry is its *near* direction (direction 0 for the first half of the ranks, direction 1 for the
second). In near/far terms each rank runs exactly the DualPipe-V order of rank h of a V over p/2
ranks and m/2 micro-batches (``theory.pp.v._dualpipe_v``): DualPipe-V is DualPipe cut in half
(DeepSeek's DualPipe README, after Sea AI Lab's "cut-in-half"), the far direction's stages
playing chunk 1's. Here chunk c *is* direction c, stages are numbered as on the V (chunk 0 of
rank r is stage r, chunk 1 stage 2p − 1 − r), but the two directions are two chains: stage p − 1
(the end of direction 0) sends nothing to stage p (the entry of direction 1). Micro-batches
0..m/2 − 1 go down, m/2..m − 1 go up.

:func:`dualpipe_memory` predicts, per rank, the parameters (in 1F1B's per-rank units: 2 for both
directions' stages) and the activations held at the peak (in micro-batch-stages, the unit of the
README's table, where 1F1B's rank 0 holds p); ``README_TABLE`` is that table.

:func:`readme_bubble` is the README's idle time per device, (PP/2 − 1)(F&B + B − 3W), with its B the
*full* backward (our B + W) and F&B = F + B + W (the pair's two parts one after the other, nothing
overlapped, as on a CPU). With each overlapped pair one unit (both inputs received before it, both
outputs sent after it: DeepSeek's ``dualpipe.py`` steps, torch's ``OVERLAP_F_B``), the simulated
order idles exactly that at F = B = W: (PP/2 − 1)·2F per rank, twice the fill of the deepest rank
(h = PP/2 − 1 forwards before its first micro-batch arrives). At other cost ratios it is neither
above nor below the simulation in general (tests/theory/test_schedules_dual.py): a formula for the
equal-cost case, not a bound.

Pure Python; no torch.
"""

from __future__ import annotations

from playbook.theory.pp.simulator import in_flight, simulate
from playbook.theory.pp.types import Schedule
from playbook.theory.pp.schedules import with_communication
from playbook.theory.pp.v import _dualpipe_v, _dualpipe_v_order

# DeepSeek's DualPipe README, "Pipeline Bubbles and Memory Usage Comparison" (PP stages, per device):
# parameters in units of 1F1B's, activations in micro-batch-stages.
README_TABLE = {
    "1f1b": {"parameters": lambda pp: 1, "activations": lambda pp: pp},
    "zb-h1": {"parameters": lambda pp: 1, "activations": lambda pp: pp},  # the README's ZB1P
    "dualpipe": {"parameters": lambda pp: 2, "activations": lambda pp: pp + 1},
    "dualpipe-v": {"parameters": lambda pp: 2, "activations": lambda pp: pp + 1},  # on pp/2 devices
}


def check_dualpipe(p: int, m: int) -> None:
    """Raise ``ValueError`` naming DualPipe's constraint and what would work."""
    for label, value in (("p (pipeline ranks)", p), ("m (micro-batches)", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    if p % 2:
        raise ValueError(f"dualpipe pairs rank r with rank p − 1 − r, so p must be even; got p={p}, try p={p + 1}")
    if m % 2 or m < 2 * p:
        raise ValueError(
            f"dualpipe sends half the micro-batches each way and needs m >= 2p = {2 * p}, m even; got m={m}; "
            f"try m in {{{', '.join(str(2 * p * k) for k in (1, 2, 3))}}}"
        )


def dualpipe_orders(p: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per-rank compute orders ``[(kind, mb, chunk), ...]``, chunk = direction (module docstring)."""
    check_dualpipe(p, m)
    half, each = p // 2, m // 2
    orders = []
    for r in range(p):
        far = int(r >= half)  # the second half of the ranks sit near the entry of direction 1
        near = _dualpipe_v(half, each, min(r, p - 1 - r))
        orders.append([(k, mb + each * (c ^ far), c ^ far) for k, mb, c in near])
    return orders


def dualpipe_pairs(p: int, m: int) -> list[list[int]]:
    """Per rank, where each overlapped F&B pair opens in :func:`dualpipe_orders`' order (the same
    places as the DualPipe-V order it is built from)."""
    check_dualpipe(p, m)
    return [_dualpipe_v_order(p // 2, m // 2, min(r, p - 1 - r)).pairs for r in range(p)]


def make_dualpipe(p: int, m: int) -> Schedule:
    """DualPipe for p ranks and m micro-batches, with its sends and receives (each overlapped pair one
    unit: both receives before it, both sends after it); checked by playing it."""
    orders = dualpipe_orders(p, m)
    schedule = with_communication("dualpipe", p, m, 2, True, orders, placement="dual", pairs=dualpipe_pairs(p, m))
    simulate(schedule)  # raises if it does not play
    return schedule


def dualpipe_memory(p: int, m: int) -> dict:
    """Per rank, from the schedule: ``parameters``, the stages it runs (each 1/p of the model) in
    units of 1F1B's one stage per rank, and ``activations``, the peak number of micro-batch-stages
    whose activations are alive (F done, W not yet)."""
    schedule = make_dualpipe(p, m)
    _, held = in_flight(schedule)
    stages = [len({schedule.stage(r, a.chunk) for a in schedule.compute(r)}) for r in range(p)]
    return {"parameters": stages, "activations": held}


def readme_bubble(pp: int, f: float, b: float, w: float) -> float:
    """The README's bubble, (PP/2 − 1)(F&B + B_full − 3W), for stage costs ``f``, ``b`` (input
    backward), ``w`` (weight backward): B_full = b + w and F&B = f + B_full, nothing overlapped.
    ``pp``: stages of one direction (DualPipe: the ranks; DualPipe-V: twice the ranks)."""
    full = b + w
    return (pp / 2 - 1) * ((f + full) + full - 3 * w)


def readme_rows(p: int) -> dict[str, dict[str, int]]:
    """The README's table at ``p`` stages: {method: {"parameters", "activations"}} per device."""
    return {name: {k: f(p) for k, f in row.items()} for name, row in README_TABLE.items()}


__all__ = [
    "README_TABLE",
    "check_dualpipe",
    "dualpipe_memory",
    "dualpipe_orders",
    "dualpipe_pairs",
    "make_dualpipe",
    "readme_bubble",
    "readme_rows",
]
