"""Compare a run with its reference, and report it in the one shape every chapter shares."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

CATEGORIES = ("params", "grads", "optimizer", "activations")


def max_rel_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """max over tensors of max|got - want| / max|want|: a relative error per tensor that a wrong
    averaging factor (×n) or a missing contribution cannot hide in. Names must match exactly."""
    if set(got) != set(want):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        raise ValueError(f"tensor names differ: missing {missing}, unexpected {extra}")
    worst = 0.0
    for name, w in want.items():
        g = got[name].to(w.dtype)
        if g.shape != w.shape:
            raise ValueError(f"{name}: shape {tuple(g.shape)} != reference {tuple(w.shape)}")
        worst = max(worst, float((g - w).abs().max() / w.abs().max().clamp_min(1e-30)))
    return worst


def rel_l2_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """max over tensors of ‖got − want‖ / ‖want‖. After AdamW steps this is the robust check:
    Adam's update g/(√v + ε) turns a gradient element that is pure rounding noise (|g| ~ ε = 1e-8)
    into a step of about lr, so a *worst-element* difference of ~lr/|w|max appears with any change
    of summation order, while a real bug moves every element."""
    return max(float((got[n] - w).norm() / w.norm().clamp_min(1e-30)) for n, w in want.items())


def compare(candidate, reference, name: str = "single process, same global batch") -> dict:
    """Parity of two :class:`~playbook.parallel.training.TrainResult`: losses, first-step
    gradients, and parameters after the last step (worst element, and relative L2 per tensor)."""
    return {
        "reference": name,
        "max_abs_loss_diff": max(abs(a - b) for a, b in zip(candidate.losses, reference.losses, strict=True)),
        "max_rel_grad_diff": max_rel_diff(candidate.grads, reference.grads),
        "max_rel_param_diff": max_rel_diff(candidate.params, reference.params),
        "max_rel_l2_param_diff": rel_l2_diff(candidate.params, reference.params),
    }


@dataclass
class RunReport:
    """What ``playbook run STRATEGY --json`` prints: one JSON object with these keys.

    memory: bytes by category for rank 0 (``predicted`` and ``measured``);
    comm: logical bytes sent per rank per step, by collective (``predicted`` and ``measured``).
    """

    strategy: str
    world_size: int
    backend: str
    parity: dict
    native: dict | None = None
    memory: dict = field(default_factory=lambda: {"predicted": {}, "measured": {}})
    comm: dict = field(default_factory=lambda: {"predicted": {}, "measured": {}})
    setup: dict = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        """A few readable lines for the terminal."""
        p = self.parity
        lines = [
            f"{self.strategy} on {self.world_size} rank(s), backend {self.backend}",
            f"  loss per step: {', '.join(f'{x:.4f}' for x in self.losses)}",
            f"  parity vs {p['reference']}: loss {p['max_abs_loss_diff']:.2e} (abs), "
            f"grads {p['max_rel_grad_diff']:.2e}, params {p['max_rel_param_diff']:.2e} (rel), "
            f"{p.get('max_rel_l2_param_diff', float('nan')):.2e} (rel L2)",
        ]
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
                lines.append(f"    {op:<22} {self.comm['predicted'].get(op, 0):>12,.0f} {self.comm['measured'].get(op, 0):>12,.0f}")
        return "\n".join(lines)
