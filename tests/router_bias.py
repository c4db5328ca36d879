"""A test helper: models whose routers favour or shun one expert, for tests of routing edges (an
expert no token reaches; one every token reaches first). Importable from any test and from their
ranks (``tests/`` is on the path of both)."""

from __future__ import annotations

import contextlib

import torch

from playbook.model.moe import moe_layers


@contextlib.contextmanager
def biased_router(module, name: str, expert: int, by: float, seen: dict | None = None):
    """While active, ``module.name`` (a model builder) returns models whose every router adds ``by``
    to ``expert``'s score: 1e4 puts it first for every token, -1e4 keeps it out of every top-k. The
    last model built is kept in ``seen["model"]`` when ``seen`` is given."""
    real = getattr(module, name)

    def build(cfg, *args, **kwargs):
        model = real(cfg, *args, **kwargs)
        bias = torch.zeros(cfg.n_experts)  # [E], added to the router's scores [T, E]
        bias[expert] = by
        for layer in moe_layers(model):
            layer.router.register_forward_hook(lambda module, inputs, out: out + bias)
        if seen is not None:
            seen["model"] = model
        return model

    setattr(module, name, build)
    try:
        yield
    finally:
        setattr(module, name, real)
