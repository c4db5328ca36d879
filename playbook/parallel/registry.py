"""The strategies ``playbook run`` knows. A chapter adds one with::

    @register("dp", help="data parallel", arguments=add_dp_arguments)
    def run_dp(setup: TrainSetup, *, world_size: int, backend: str, **options) -> RunReport: ...

``arguments(parser)`` adds the strategy's own flags; their values arrive as ``options``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

# Modules that register a strategy when imported: a chapter appends its module here.
STRATEGY_MODULES = ["playbook.parallel.single"]


@dataclass(frozen=True)
class Strategy:
    name: str
    run: Callable
    help: str
    arguments: Callable | None = None


_registry: dict[str, Strategy] = {}


def register(name: str, *, help: str, arguments: Callable | None = None):
    def add(run: Callable) -> Callable:
        _registry[name] = Strategy(name, run, help, arguments)
        return run

    return add


def _load() -> None:
    for module in STRATEGY_MODULES:
        importlib.import_module(module)


def names() -> list[str]:
    _load()
    return sorted(_registry)


def get(name: str) -> Strategy:
    _load()
    if name not in _registry:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(sorted(_registry))}")
    return _registry[name]
