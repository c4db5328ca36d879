"""The strategies ``playbook run`` knows. A chapter adds one with::

    @register("dp", help="data parallel", arguments=add_dp_arguments)
    def run_dp(setup: TrainSetup, *, world_size: int, backend: str, **options) -> RunReport: ...

``arguments(parser)`` adds the strategy's own flags; their values arrive as ``options``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

import playbook.parallel

# Modules of playbook/parallel/ that hold shared pieces rather than a strategy.
NOT_STRATEGIES = {"training", "report", "registry"}


@dataclass(frozen=True)
class Strategy:
    name: str
    run: Callable
    help: str
    arguments: Callable | None = None
    world_size: Callable[[dict], int] | None = None  # the ranks implied by the options, if --world-size is


_registry: dict[str, Strategy] = {}


def register(name: str, *, help: str, arguments: Callable | None = None, world_size: Callable | None = None):
    def add(run: Callable) -> Callable:
        _registry[name] = Strategy(name, run, help, arguments, world_size)
        return run

    return add


def _load() -> None:
    """Import every strategy module in playbook/parallel/; each registers itself."""
    for info in pkgutil.iter_modules(playbook.parallel.__path__):
        if info.name not in NOT_STRATEGIES and not info.name.startswith("_"):
            importlib.import_module(f"playbook.parallel.{info.name}")


def names() -> list[str]:
    _load()
    return sorted(_registry)


def get(name: str) -> Strategy:
    _load()
    if name not in _registry:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(sorted(_registry))}")
    return _registry[name]
