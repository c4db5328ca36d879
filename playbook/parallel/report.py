"""Compare a run with its reference, and report it in the one shape every chapter shares."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import torch

CATEGORIES = ("params", "grads", "optimizer", "activations")


def _check_names(got: dict, want: dict) -> None:
    if set(got) != set(want):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        raise ValueError(f"tensor names differ: missing {missing}, unexpected {extra}")


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _worst(values) -> float:
    """``max`` that cannot drop a NaN (Python's ``max`` skips it when it is not first)."""
    worst = 0.0
    for v in values:
        if math.isnan(v) or v == math.inf:  # NaN or inf: nothing can be worse
            return float("inf")
        worst = max(worst, v)
    return worst


def max_rel_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """max over tensors of max|got - want| / max|want|: a relative error per tensor that a wrong
    averaging factor (×n) or a missing contribution cannot hide in. Names must match exactly.
    A NaN or inf on either side makes it ``inf``, so ``max_rel_diff(...) < tol`` fails."""
    _check_names(got, want)
    worst = []
    for name, w in want.items():
        g = got[name].to(w.dtype)
        if g.shape != w.shape:
            raise ValueError(f"{name}: shape {tuple(g.shape)} != reference {tuple(w.shape)}")
        if not (_finite(g) and _finite(w)):
            return float("inf")
        worst.append(float((g - w).abs().max() / w.abs().max().clamp_min(1e-30)) if w.numel() else 0.0)
    return _worst(worst)


def rel_l2_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """max over tensors of ‖got − want‖ / ‖want‖. After AdamW steps this is the robust check:
    Adam's update g/(√v + ε) turns a gradient element that is pure rounding noise (|g| ~ ε = 1e-8)
    into a step of about lr, so a *worst-element* difference of ~lr/|w|max appears with any change
    of summation order, while a real bug moves every element. NaN or inf anywhere: ``inf``."""
    _check_names(got, want)
    worst = []
    for n, w in want.items():
        g = got[n].to(w.dtype)
        if not (_finite(g) and _finite(w)):
            return float("inf")
        worst.append(float((g - w).norm() / w.norm().clamp_min(1e-30)))
    return _worst(worst)


def max_abs_loss_diff(got: list[float], want: list[float]) -> float:
    """Worst |got − want| over steps; ``inf`` if either side has a NaN or inf loss."""
    if len(got) != len(want):
        raise ValueError(
            f"cannot compare losses: the run has {len(got)} step(s), the reference {len(want)}; "
            "train both for the same number of steps"
        )
    return _worst(abs(a - b) if math.isfinite(a) and math.isfinite(b) else float("inf") for a, b in zip(got, want))


def all_finite(*results) -> bool:
    """True when every loss, gradient and parameter of every result is a finite number."""
    for r in results:
        if not all(math.isfinite(x) for x in r.losses):
            return False
        if not all(_finite(t) for d in (r.grads, r.params) for t in d.values()):
            return False
    return True


def compare(candidate, reference, name: str = "single process, same global batch") -> dict:
    """Parity of two :class:`~playbook.parallel.training.TrainResult`: losses, first-step
    gradients, and parameters after the last step (worst element, and relative L2 per tensor,
    the gate after AdamW steps). ``finite`` is False when either run produced a NaN or inf
    anywhere; every difference is then ``inf``, so a check ``parity[...] < tol`` fails."""
    return {
        "reference": name,
        "finite": all_finite(candidate, reference),
        "max_abs_loss_diff": max_abs_loss_diff(candidate.losses, reference.losses),
        "max_rel_grad_diff": max_rel_diff(candidate.grads, reference.grads),
        "max_rel_param_diff": max_rel_diff(candidate.params, reference.params),
        "max_rel_l2_param_diff": rel_l2_diff(candidate.params, reference.params),
    }


GATED = ("max_abs_loss_diff", "max_rel_grad_diff", "max_rel_l2_param_diff")  # worst element: information only


def failures(parity: dict, limits: dict[str, float]) -> list[str]:
    """One line per gated figure over its bound (a NaN fails too); empty when the run agrees."""
    return [
        f"{k} = {parity[k]:.3e} > bound {limits[k]:.3e}"
        for k in GATED
        if k in limits and not parity[k] <= limits[k]  # `not <=` so that NaN fails
    ]


def bounds_lines(parity: dict) -> list[str]:
    """The line a summary prints under its parity figures: the bounds they are held to, if any."""
    b = parity.get("bounds")
    if not b:
        return []
    return [
        f"  bounds, max(1e-5, 3 x this machine's float32 floor): loss {b['max_abs_loss_diff']:.2e}, "
        f"grads {b['max_rel_grad_diff']:.2e}, params {b['max_rel_l2_param_diff']:.2e}"
    ]


def parity_problem(parity: dict | None) -> str | None:
    """Why a parity dict must not be trusted (a diverged run), or why it fails its bounds
    (``parity["bounds"]``, set by :func:`playbook.parallel.parity.gated`), or None."""
    if not parity or "max_abs_loss_diff" not in parity:
        return None
    if parity.get("finite") is False:
        return "the run diverged: a loss, gradient or parameter is NaN or inf, so parity is meaningless"
    numbers = [v for k, v in parity.items() if k.startswith("max_") and isinstance(v, float)]
    if any(not math.isfinite(v) for v in numbers):
        return "a parity figure is NaN or inf: the run diverged"
    bad = failures(parity, parity.get("bounds") or {})
    if bad:
        return "outside the float32 bounds (max(1e-5, 3 x this machine's float floor)): " + "; ".join(bad)
    return None


@dataclass
class Report:
    """What every strategy's ``run`` returns, so ``playbook run`` handles them alike: ``summary()``
    (the terminal's lines), ``to_json()`` (``--json``: one object, the dataclass's fields) and
    ``problem()`` (why parity failed, or None: the command's exit status)."""

    strategy: str
    world_size: int

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def problem(self) -> str | None:
        raise NotImplementedError

    def summary(self) -> str:
        raise NotImplementedError


@dataclass
class RunReport(Report):
    """A training run's report: what ``playbook run STRATEGY --json`` prints, one JSON object with
    these keys.

    memory: bytes by category for rank 0 (``predicted`` and ``measured``);
    comm: logical bytes sent per rank per step, by collective (``predicted`` and ``measured``).
    """

    backend: str
    parity: dict
    native: dict | None = None
    memory: dict = field(default_factory=lambda: {"predicted": {}, "measured": {}})
    comm: dict = field(default_factory=lambda: {"predicted": {}, "measured": {}})
    setup: dict = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)

    def problem(self) -> str | None:
        """Why this report's parity cannot be trusted (NaN or inf on either side), or None."""
        return parity_problem(self.parity)

    def summary(self) -> str:
        """A few readable lines for the terminal."""
        p = self.parity
        lines = [
            f"{self.strategy} on {self.world_size} rank(s), backend {self.backend}",
            f"  loss per step: {', '.join(f'{x:.4f}' for x in self.losses)}",
            f"  parity vs {p['reference']}: loss {p['max_abs_loss_diff']:.2e} (abs), "
            f"grads {p['max_rel_grad_diff']:.2e} (rel), params {p.get('max_rel_l2_param_diff', float('nan')):.2e} (rel L2), "
            f"worst element {p['max_rel_param_diff']:.2e}",
        ]
        lines += bounds_lines(p)
        if self.problem():
            lines.insert(1, f"  PARITY FAILED: {self.problem()}")
        if self.native and "skipped" in self.native:
            lines.append(f"  native: skipped ({self.native['skipped']})")
        elif self.native:
            lines.append(f"  native ({self.native['reference']}): grads {self.native['max_rel_grad_diff']:.2e} (rel)")
        lines.append(f"  memory, rank 0 (bytes)   {'predicted':>12} {'measured':>12}")
        pred, meas = self.memory["predicted"], self.memory["measured"]
        for k in CATEGORIES:
            lines.append(f"    {k:<22} {pred.get(k, 0):>12,.0f} {meas.get(k, 0) or 0:>12,.0f}")
        if self.comm["predicted"] or self.comm["measured"]:
            lines.append("  comm per rank per step (bytes sent)")
            for op in sorted(set(self.comm["predicted"]) | set(self.comm["measured"])):
                lines.append(
                    f"    {op:<22} {self.comm['predicted'].get(op, 0):>12,.0f} {self.comm['measured'].get(op, 0):>12,.0f}"
                )
        return "\n".join(lines)
