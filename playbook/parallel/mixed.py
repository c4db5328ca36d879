"""Mixed-precision training: bf16 parameters and gradients, fp32 master weights and AdamW states.

Micikevicius et al. 2018, *Mixed Precision Training*, arXiv:1710.03740, §3.1: forward and backward
run on 16-bit weights, but every update is applied to an fp32 *master copy*, which is then rounded
back into the 16-bit weights. An update smaller than half a 16-bit ulp of its weight would vanish
if applied in 16 bits (bf16 keeps 8 significant bits: near 1.0 anything below 2⁻⁹ ≈ 0.002 is
lost); in the fp32 master it accumulates until it shows. ZeRO (Rajbhandari et al. 2019,
arXiv:1910.02054, §3.1) counts the bytes this costs per parameter: 2 (bf16 weights) + 2 (bf16
gradients) + K = 12 (fp32 master, Adam momentum, Adam variance), 16Ψ in all:
``playbook.theory.hybrid.memory.model_state_bytes(precision="mixed")``.

:class:`MixedPrecisionAdamW` is the optimizer hook of ``playbook.parallel.training.train`` (it
has ``zero_grad`` and ``step``); the model is cast to bf16 by :func:`to_mixed`, so its
activations are bf16 too. No loss scaling: bf16 has fp32's exponent range, so gradients do not
underflow the way fp16's do (the paper's §3.2 is for fp16).
"""

from __future__ import annotations

import torch

from playbook.model.gpt import GPT
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.inventory.model_state import TrainingMemory

PRECISIONS = ("fp32", "mixed")
LOW = torch.bfloat16  # what the model's parameters, gradients and activations are stored in


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def to_mixed(model: torch.nn.Module) -> torch.nn.Module:
    """Cast every parameter and buffer to bf16, in place (returns the model)."""
    return model.to(LOW)


class MixedPrecisionAdamW:
    """AdamW on fp32 master copies of a bf16 model's parameters (Micikevicius et al. 2018, §3.1).

    ``step()``: each bf16 gradient is cast up into its master's ``.grad`` (fp32), ``torch.optim.AdamW``
    updates the masters, then each master is rounded (to nearest) into its bf16 parameter and the
    fp32 gradients are dropped. While ``step`` runs, those fp32 gradients are 4Ψ more bytes held
    briefly; between steps the optimizer holds the masters (4Ψ) and AdamW's two moments (8Ψ) and
    its per-tensor ``step`` scalars.

    ``state`` maps each master to ``{"master": master, **AdamW's state}``, so
    ``playbook.measure.memory.optimizer_bytes`` (which sums the tensors of ``optimizer.state``)
    counts the masters with the moments: the K = 12 bytes per parameter of ZeRO §3.1.
    """

    def __init__(self, params, *, lr: float, **adamw):
        self.params = list(params)
        if not self.params:
            raise ValueError("MixedPrecisionAdamW needs at least one parameter")
        self.masters = [p.detach().to(torch.float32, copy=True) for p in self.params]  # fp32, same shapes
        self.adamw = torch.optim.AdamW(self.masters, lr=lr, **adamw)

    @property
    def state(self) -> dict:
        inner = self.adamw.state
        return {m: {"master": m, **inner.get(m, {})} for m in self.masters}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)  # cast up: [same shape] fp32
        self.adamw.step()
        for p, m in zip(self.params, self.masters):
            p.copy_(m)  # round to nearest bf16
            m.grad = None


def optimizer_for(model: torch.nn.Module, setup: TrainSetup, precision: str):
    """The optimizer a run of ``precision`` uses: plain AdamW (fp32) or :class:`MixedPrecisionAdamW`."""
    check_precision(precision)
    if precision == "mixed":
        return MixedPrecisionAdamW(model.parameters(), lr=setup.lr)
    return torch.optim.AdamW(model.parameters(), lr=setup.lr)


def train_mixed(setup: TrainSetup, *, device="cpu", **hooks) -> TrainResult:
    """The single-process reference in mixed precision: ``GPT(cfg, seed)`` cast to bf16 (the same
    weights as the fp32 reference, rounded), :class:`MixedPrecisionAdamW`, the one training loop."""
    model = to_mixed(GPT(setup.config(), seed=setup.seed).to(device))
    return train(setup, device=device, model=model, optimizer=optimizer_for(model, setup, "mixed"), **hooks)


def predicted_memory(setup: TrainSetup, world_size: int = 1, *, precision: str = "mixed") -> TrainingMemory:
    """Bytes on one data-parallel rank by category, ``precision`` "mixed" or "fp32", with AdamW's
    per-tensor step counters (``training_memory(..., n_tensors=...)``), activations of its rows."""
    check_precision(precision)
    return setup.predicted_memory(world_size, precision=precision)
