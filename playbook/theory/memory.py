"""Memory calculator (skeleton: signatures and result types are fixed; bodies are being written)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per rank by category (for the most loaded rank)."""

    params: float
    grads: float
    optimizer: float
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class InferenceMemory:
    """Bytes per rank for serving: resident weights and the KV cache."""

    weights: float
    kv_cache: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}
