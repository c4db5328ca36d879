"""The one parity gate: how close a parallel float32 run must come to the single process.

A parallel run sums in another order than one process, so in float32 the two differ by rounding.
How much depends on the model, the number of AdamW steps and the CPU's float32 kernels: Adam
divides each gradient element by its own magnitude, so an element whose gradient is rounding noise
moves by about ``lr`` either way (Kingma & Ba 2015, the update m̂/(√v̂ + ε)). A fixed tolerance
therefore passes on one CPU and fails on another. The gate instead measures what float32 rounding
does to *this* setup on *this* machine: the same single process in float64 is the exact answer,
and the float32 reference's distance from it is the **float floor**. A correct parallel run is
another float32 run, about one floor from exact, so it sits within about two floors of the
reference; the bound is

    bound = max(1e-5 relative, 3 × float floor)      loss and every gradient
    bound = max(1e-5 relative, 10 × float floor)     parameters after AdamW, by relative L2 per tensor

Parameters get the wider margin because Adam's per-element division turns the rounding noise of the
few elements whose gradient is nearly zero into steps of about ``lr`` either way, so two correct
float32 runs can sit several floors apart on the very tensor that sets the floor (measured: MoE
dp2×pp2, ``blocks.1.attn.o_proj.weight``, 3.4 floors from the float64 answer on one CPU, under one
on another, while loss and gradients stayed within one floor). A real bug moves whole

tensors: a missing gradient reduction by O(1), a 0.3% learning-rate error by ~1e-3 of a tensor
(``tests/parallel/test_parity_gate.py`` keeps both red against the bound).
"""

from __future__ import annotations

import functools

import torch

from playbook.model.gpt import GPT
from playbook.model.gpt import build_moe as build
from playbook.parallel.mixed import train_mixed
from playbook.parallel.report import compare, failures
from playbook.parallel.training import TrainResult, TrainSetup, train

RELATIVE = 1e-5  # the tolerance where float32 is closer than this to exact
MARGIN = 3  # two float32 runs, each about one floor from exact, with room to spare
PARAM_MARGIN = 10  # the same after AdamW, whose per-element steps amplify rounding noise (module docstring)


@functools.lru_cache(maxsize=32)
def reference(setup: TrainSetup, dtype: torch.dtype = torch.float32, max_norm: float | None = None) -> TrainResult:
    """The single process on the whole global batch, in ``dtype`` (the MoE model built as its chapter
    builds it), on one thread like one rank (several threads on a busy 2-core machine run 10-30x slower).
    ``max_norm``: clipped by torch's ``clip_grad_norm_`` after each backward (``parallel.clip``), its
    total norms in ``grad_norms``. Computed once per setup and process: the run it is compared with and
    its float floor share it (callers read it, never change it)."""
    from playbook.parallel.clip import clip_reference

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = setup.config()
        model = build(cfg, setup.seed) if cfg.is_moe else GPT(cfg, seed=setup.seed)
        norms: list[float] = []
        clip = clip_reference(max_norm, norms) if max_norm is not None else None
        result = train(setup, model=model.to(dtype), measure=dtype == torch.float32, sync_grads=clip)
        result.grad_norms = norms
        return result
    finally:
        torch.set_num_threads(threads)


def floor_of(single: TrainResult, exact: TrainResult) -> dict:
    """The float floor from a float32 run and the same run in float64: the figures of
    :func:`~playbook.parallel.report.compare`, plus ``loss_scale`` (the largest |loss|)."""
    return compare(single, exact, "the same single process in float64") | {
        "loss_scale": max((abs(x) for x in single.losses), default=1.0)
    }


@functools.lru_cache(maxsize=64)
def _floor(setup: TrainSetup, max_norm: float | None = None) -> dict:  # the references are cached, the comparison too
    return floor_of(reference(setup, max_norm=max_norm), reference(setup, torch.float64, max_norm))


def float_floor(setup: TrainSetup, max_norm: float | None = None) -> dict:
    """What float32 rounding alone does to ``setup`` (clipped at ``max_norm``): the float32 single
    process against float64 (computed once per setup and process)."""
    return dict(_floor(setup, max_norm))


def bounds_from(floor: dict) -> dict[str, float]:
    """The bound for each gated figure: max(1e-5 relative, 3 × the float floor), 10 × for parameters
    after AdamW (module docstring). The loss difference is absolute, so its 1e-5 is relative to the
    largest loss."""
    return {
        "max_abs_loss_diff": max(RELATIVE * max(1.0, floor["loss_scale"]), MARGIN * floor["max_abs_loss_diff"]),
        "max_rel_grad_diff": max(RELATIVE, MARGIN * floor["max_rel_grad_diff"]),
        "max_rel_l2_param_diff": max(RELATIVE, PARAM_MARGIN * floor["max_rel_l2_param_diff"]),
    }


def bounds(setup: TrainSetup) -> dict[str, float]:
    """The bounds for ``setup``'s parity, from its float floor on this machine."""
    return bounds_from(_floor(setup))


def gated(parity: dict, setup: TrainSetup, floor: dict | None = None) -> dict:
    """``parity`` with its bounds (``parity["bounds"]``) and the verdict (``parity["within_bounds"]``),
    as ``playbook run`` reports it; :meth:`~playbook.parallel.report.RunReport.problem` reads them.
    ``floor`` (from :func:`floor_of`) replaces ``setup``'s own for a reference other than :func:`reference`."""
    limits = bounds_from(floor if floor is not None else _floor(setup))
    return parity | {"bounds": limits, "within_bounds": not failures(parity, limits)}


MIXED = "single process in mixed precision, same global batch"


def single_in(setup: TrainSetup, precision: str = "fp32") -> TrainResult:
    """The single process on ``setup`` in ``precision``: :func:`reference` (float32, cached), or the
    same model and batches in bf16 with fp32 masters (``parallel.mixed.train_mixed``)."""
    return train_mixed(setup) if precision == "mixed" else reference(setup)


def against_single(result: TrainResult, setup: TrainSetup, precision: str = "fp32", single=None) -> dict:
    """``result``'s parity with the single process in its own precision (``single``, or
    :func:`single_in`), as ``playbook run`` reports it: float32 gated (:func:`gated`); mixed not
    gated: bf16 against bf16, the float32 bounds do not apply (tests/parallel/test_mixed.py)."""
    single = single_in(setup, precision) if single is None else single
    if precision == "mixed":
        return compare(result, single, MIXED)
    return gated(compare(result, single), setup)


def assert_parity(parity: dict, setup: TrainSetup | None = None, what: str = "", *, floor: dict | None = None) -> None:
    """Fail with every figure over its bound, and the floor the bounds came from: ``setup``'s own
    floor, or ``floor`` (from :func:`floor_of`) for a reference other than :func:`reference`."""
    floor = floor if floor is not None else _floor(setup)
    bad = failures(parity, bounds_from(floor))
    assert not bad, f"{what}: {'; '.join(bad)} (float floor {floor}); parity {parity}"
