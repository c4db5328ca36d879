"""A seeded simulation of a run under failures: what :func:`playbook.theory.life.goodput.goodput`
predicts in closed form, counted event by event.

The run does ``segments`` pieces of work of ``interval`` seconds, each followed by a save of
``save`` seconds; failures arrive with exponential inter-arrival times of mean ``mtbf`` (a Poisson
process, as in Young 1974 and Daly 2006), at any moment: during work, a save or a restart. A
failure throws away the segment in progress (work since the last completed save) and costs a
restart of ``restart`` seconds, after which the segment starts again. Goodput is kept work over wall
time. ``replicas`` independent runs give a mean and its standard error, so a test can say "within a
few standard errors" of the closed form. Pure Python (``random.Random``), no torch.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Simulated:
    """The mean goodput over the replicas, its standard error, and what happened."""

    goodput: float
    stderr: float
    replicas: int
    failures: int  # over all replicas
    goodputs: tuple[float, ...]


def one_run(rng: random.Random, interval: float, save: float, mtbf: float, restart: float, segments: int) -> tuple[float, int]:
    """One run: (goodput, failures). Memoryless failures, so the clock to the next one is drawn
    afresh whenever a piece of time (a segment, a restart) starts."""
    wall, failures, done = 0.0, 0, 0
    piece = interval + save
    while done < segments:
        t = rng.expovariate(1.0 / mtbf)
        if t >= piece:
            wall += piece
            done += 1
            continue
        wall += t  # the segment's work and any part of its save are lost
        failures += 1
        while True:  # the restart itself may be hit by a failure, and starts over
            t = rng.expovariate(1.0 / mtbf)
            if t >= restart:
                wall += restart
                break
            wall += t
            failures += 1
    return segments * interval / wall, failures


def simulate(
    interval: float,
    save: float,
    mtbf: float,
    restart: float = 0.0,
    *,
    segments: int = 2000,
    replicas: int = 20,
    seed: int = 0,
) -> Simulated:
    """``replicas`` seeded runs of ``segments`` checkpoint intervals each (see the module docstring)."""
    for name, x in (("interval", interval), ("mtbf", mtbf)):
        if not x > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {x!r}")
    for name, x in (("save", save), ("restart", restart)):
        if not x >= 0:
            raise ValueError(f"{name} must be a number of seconds at least 0, got {x!r}")
    if (interval + save) / mtbf > 50:
        raise ValueError(
            f"interval + save = {interval + save:g} s is over 50 MTBFs ({mtbf:g} s): a segment would almost "
            "never finish; try an interval nearer sqrt(2·save·mtbf)"
        )
    if replicas < 2 or segments < 1:
        raise ValueError(f"replicas must be at least 2 and segments at least 1, got {replicas} and {segments}")
    rng = random.Random(seed)
    runs = [one_run(rng, interval, save, mtbf, restart, segments) for _ in range(replicas)]
    values = tuple(g for g, _ in runs)
    mean = sum(values) / replicas
    var = sum((g - mean) ** 2 for g in values) / (replicas - 1)
    return Simulated(mean, math.sqrt(var / replicas), replicas, sum(f for _, f in runs), values)
