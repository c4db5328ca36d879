"""The strategies ``playbook run`` knows, and the one shape every strategy has.

A strategy is a module (``STRATEGY_MODULES``) that provides (see :class:`Strategy`):

- ``on_rank(ctx, setup, *, option=...)``: its rank entry, keyword options only, groups from
  ``ctx.mesh_for(ParallelDims(...))``, training through ``parallel.training.train`` and hooks;
- a prediction in ``playbook.theory`` (no torch) of what the run measures;
- ``add_arguments(parser)``: its command-line flags (values arrive as keyword options of ``run``);
- ``run(setup, *, world_size, backend, **options) -> RunReport``: launch, compare with the
  single process, report predicted beside measured.

It registers itself::

    @register("dp", help="data parallel", arguments=add_arguments, on_rank=on_rank, predict=predicted_comm)
    def run_dp(setup: TrainSetup, *, world_size: int, backend: str = "auto", **options) -> RunReport: ...

``STRATEGY_MODULES`` names the module of each strategy, so that listing them imports nothing and
``get(name)`` imports that strategy's module alone (not every distributed stack).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable

# name -> the module that registers it (absolute: a strategy may live outside parallel/, as serving does)
STRATEGY_MODULES = {
    "single": "playbook.parallel.single",
    "dp": "playbook.parallel.dp.run",
    "zero": "playbook.parallel.zero.run",
    "fsdp2": "playbook.parallel.zero.fsdp2",
    "tp": "playbook.parallel.tp.run",
    "pp": "playbook.parallel.pp.run",
    "cp": "playbook.parallel.cp.run",
    "ep": "playbook.parallel.ep.run",
    "hybrid": "playbook.parallel.hybrid.run",
    "serve": "playbook.serve.run",
}


@dataclass(frozen=True)
class Strategy:
    """What ``playbook run NAME`` needs of a strategy (the module docstring says what each is)."""

    name: str
    run: Callable
    help: str
    arguments: Callable | None = None
    world_size: Callable[[dict], int] | None = None  # the ranks implied by the options, if --world-size is
    on_rank: Callable | None = None
    predict: Callable | None = None
    check: Callable | None = None  # check(args): refuse its own bad options before the memory check and any rank

    def problems(self) -> list[str]:
        """Where this strategy departs from the shape (empty when it conforms)."""
        out = []
        run = inspect.signature(self.run).parameters
        for name in ("world_size", "backend"):
            if name not in run or run[name].kind is not inspect.Parameter.KEYWORD_ONLY:
                out.append(f"run must take keyword-only {name}")
        if self.on_rank is None:
            out.append("no rank entry (on_rank=)")
        else:
            params = list(inspect.signature(self.on_rank).parameters.values())
            if not params or params[0].name != "ctx":
                out.append("on_rank's first parameter must be ctx")
            flags = [
                p.name
                for p in params
                if p.default is not inspect.Parameter.empty
                and isinstance(p.default, bool)
                and p.kind is not inspect.Parameter.KEYWORD_ONLY
            ]
            if flags:
                out.append(f"on_rank takes positional booleans {flags}: make them keyword-only")
        if self.predict is None or not self.predict.__module__.startswith("playbook.theory"):
            out.append("its prediction (predict=) must live in playbook.theory")
        return out


_registry: dict[str, Strategy] = {}


def register(
    name: str,
    *,
    help: str,
    arguments: Callable | None = None,
    world_size: Callable | None = None,
    on_rank: Callable | None = None,
    predict: Callable | None = None,
    check: Callable | None = None,
):
    def add(run: Callable) -> Callable:
        _registry[name] = Strategy(name, run, help, arguments, world_size, on_rank, predict, check)
        return run

    return add


def names() -> list[str]:
    """Every strategy's name (the table's, and any registered at run time), importing none of them."""
    return sorted(set(STRATEGY_MODULES) | set(_registry))


def get(name: str) -> Strategy:
    """The strategy ``name``, importing its module (and only that one) on first use."""
    if name not in _registry and name in STRATEGY_MODULES:
        importlib.import_module(STRATEGY_MODULES[name])
    if name not in _registry:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(names())}")
    return _registry[name]
