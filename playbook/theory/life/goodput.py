"""Goodput against the checkpoint interval: how often to save when failures are routine.

A run saves a checkpoint every ``interval`` seconds of work, each save takes ``save`` seconds, and
after a failure the job takes ``restart`` seconds (detect, reschedule, reload) and redoes the work
since the last checkpoint. Failures arrive at random with mean time between failures ``mtbf`` (an
exponential inter-arrival, the assumption of both papers below); goodput is the share of wall-clock
time that becomes kept training work.

- Young (1974), *A first order approximation to the optimum checkpoint interval*, Comm. ACM 17(9):
  the interval that minimises the first-order loss ``save / interval + (interval / 2 + restart) / mtbf``
  is ``sqrt(2 · save · mtbf)``.
- Daly (2006), *A higher order estimate of the optimum checkpoint interval for restart dumps*,
  Future Generation Computer Systems 22(3): for exponential failures the expected wall time of work
  ``W`` is ``mtbf · e^(restart/mtbf) · (e^((interval + save)/mtbf) − 1) · W / interval`` (exact
  under the model: failures may strike during a save or a restart too), and its optimum is
  ``sqrt(2·save·mtbf) · [1 + (1/3)·sqrt(save/(2·mtbf)) + (1/9)·(save/(2·mtbf))] − save`` for
  ``save < 2·mtbf``, else ``mtbf``.

A cluster's MTBF comes from a per-GPU failure rate: with ``n`` GPUs failing independently at
``λ`` per GPU-hour, failures arrive at ``n·λ`` per hour. Llama 3 (Dubey et al. 2024, *The Llama 3
Herd of Models*, arXiv:2407.21783, §3.3.4) reports 419 unexpected interruptions in 54 days of
pre-training on 16,384 H100s: :data:`LLAMA3_FAILURES_PER_GPU_HOUR` ≈ 1.97e-5, an MTBF of ~3.1 h at
that size. Pure arithmetic; times in seconds.
"""

from __future__ import annotations

import math

# Dubey et al. 2024, §3.3.4 (Table 5's period): 419 unexpected interruptions, 54 days, 16,384 GPUs
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384
LLAMA3_FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)


def _positive(**values: float) -> None:
    for name, x in values.items():
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {x!r}")


def _not_negative(**values: float) -> None:
    for name, x in values.items():
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise ValueError(f"{name} must be a number of seconds at least 0, got {x!r}")


def cluster_mtbf(gpus: int, failures_per_gpu_hour: float = LLAMA3_FAILURES_PER_GPU_HOUR) -> float:
    """Mean time between failures of ``gpus`` GPUs in seconds: 3600 / (gpus · λ), independent
    failures (the minimum of n exponentials is exponential with n times the rate)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    if not (isinstance(failures_per_gpu_hour, (int, float)) and 0 < failures_per_gpu_hour < math.inf):
        raise ValueError(f"failures per GPU-hour must be a positive number (Llama 3: 1.97e-5), got {failures_per_gpu_hour!r}")
    return 3600.0 / (gpus * failures_per_gpu_hour)


def young_interval(save: float, mtbf: float) -> float:
    """Young (1974): the work between checkpoints that minimises the first-order loss, sqrt(2·save·mtbf)."""
    _positive(save=save, mtbf=mtbf)
    return math.sqrt(2.0 * save * mtbf)


def daly_interval(save: float, mtbf: float) -> float:
    """Daly (2006): Young's interval with the next terms of the series, minus the save;
    ``mtbf`` itself when a save takes at least 2·mtbf."""
    _positive(save=save, mtbf=mtbf)
    if save >= 2.0 * mtbf:
        return mtbf
    x = save / (2.0 * mtbf)
    return math.sqrt(2.0 * save * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save


def goodput(interval: float, save: float, mtbf: float, restart: float = 0.0) -> float:
    """Share of wall time that is kept work, for exponential failures (Daly 2006):
    interval / (mtbf · e^(restart/mtbf) · (e^((interval + save)/mtbf) − 1))."""
    _positive(interval=interval, mtbf=mtbf)
    _not_negative(save=save, restart=restart)
    exponent = (interval + save) / mtbf + restart / mtbf
    if exponent > 700:  # e^700 is near float's limit: the run essentially never finishes a segment
        return 0.0
    return interval / (mtbf * math.exp(restart / mtbf) * math.expm1((interval + save) / mtbf))


def goodput_first_order(interval: float, save: float, mtbf: float, restart: float = 0.0) -> float:
    """Young's first-order view: 1 − save/interval − (interval/2 + restart)/mtbf (each failure loses
    half an interval on average and a restart); a straight reading of where the time goes."""
    _positive(interval=interval, mtbf=mtbf)
    _not_negative(save=save, restart=restart)
    return 1.0 - save / interval - (interval / 2.0 + restart) / mtbf


def best_interval(save: float, mtbf: float, restart: float = 0.0) -> float:
    """The interval that maximises :func:`goodput`, found numerically (golden-section search on
    [save/1e3, 10·mtbf]): what Young's and Daly's closed forms approximate."""
    _positive(save=save, mtbf=mtbf)
    _not_negative(restart=restart)
    lo, hi = save / 1e3, 10.0 * mtbf
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    for _ in range(200):
        if goodput(a, save, mtbf, restart) > goodput(b, save, mtbf, restart):
            hi, b = b, a
            a = hi - ratio * (hi - lo)
        else:
            lo, a = a, b
            b = lo + ratio * (hi - lo)
    return (lo + hi) / 2.0


def summary(save: float, mtbf: float, restart: float = 0.0) -> dict:
    """Young's and Daly's intervals and the goodput at each, and the numerical optimum."""
    young, daly, best = young_interval(save, mtbf), daly_interval(save, mtbf), best_interval(save, mtbf, restart)
    return {
        "save_s": save,
        "mtbf_s": mtbf,
        "restart_s": restart,
        "young_s": young,
        "daly_s": daly,
        "best_s": best,
        "goodput_young": goodput(young, save, mtbf, restart),
        "goodput_daly": goodput(daly, save, mtbf, restart),
        "goodput_best": goodput(best, save, mtbf, restart),
    }
