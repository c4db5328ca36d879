"""The strategies ``playbook run`` knows, and the one shape every strategy has.

A strategy is a module (``STRATEGY_MODULES``, absolute module paths) that provides (see :class:`Strategy`):

- ``on_rank(ctx, setup, *, option=...)``: its rank entry, ``ctx`` and the ``TrainSetup`` positional,
  every option keyword-only, so one caller runs any strategy as ``ranks.run(s.on_rank, setup,
  **options)``; groups from ``ctx.mesh_for(ParallelDims(...))``, training through
  ``parallel.training.train`` and hooks;
- ``predict(setup, *, world_size, option=...)`` (where it exists before any rank starts): the bytes
  one rank sends per step by collective (rows named ``"<op> <what>"``, as DP's ``"all_reduce calls"``,
  are extras for the report), from ``playbook.theory``, taking ``on_rank``'s options; the
  run puts it in its report as ``comm["predicted"]`` and ``parallel.step_time`` puts it beside the
  measured step. None where the bytes depend on the run (EP's routing) or are counted otherwise
  (the hybrid by mesh axis, serving per token): those reports compute theirs from ``playbook.theory``;
- ``add_arguments(parser)``: its command-line flags (values arrive as keyword options of ``run``);
- ``run(setup, *, world_size, backend, launch, **options) -> Report``: start ranks through
  ``launch`` (the command's :class:`~playbook.cluster.Launcher`: its timeout, progress bar and
  traces; ``cluster.launch`` by default), compare with the single process, report predicted beside
  measured in a :class:`~playbook.parallel.report.Report`.

It registers itself::

    @register("dp", help="data parallel", arguments=add_arguments, on_rank=on_rank, predict=predict)
    def run_dp(setup: TrainSetup, *, world_size: int, backend: str = "auto", launch=launch, **options) -> RunReport: ...

``STRATEGY_MODULES`` names the module of each strategy, so that listing them imports nothing and
``get(name)`` imports that strategy's module alone (not every distributed stack).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable, get_type_hints

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
    predict: Callable | None = None  # bytes per rank per step by collective, before any rank; None: see above
    check: Callable | None = None  # check(args): refuse its own bad options before the memory check and any rank

    def problems(self) -> list[str]:
        """Where this strategy departs from the shape (empty when it conforms)."""
        out = []
        run = inspect.signature(self.run).parameters
        for name in ("world_size", "backend", "launch"):
            if name not in run or run[name].kind is not inspect.Parameter.KEYWORD_ONLY:
                out.append(f"run must take keyword-only {name}")
        from playbook.parallel.report import Report  # here: listing the strategies imports no torch

        try:
            returns = get_type_hints(self.run).get("return")
        except NameError as e:  # an annotation naming something its module does not import
            returns = f"an unresolvable annotation ({e})"
        if not (isinstance(returns, type) and issubclass(returns, Report)):
            out.append(f"run must return a Report (parallel.report), not {returns}")
        if self.on_rank is None:
            out.append("no rank entry (on_rank=)")
        else:
            out += _options_after(self.on_rank, ("ctx", "setup"), "on_rank")
        if self.predict is not None:
            out += _options_after(self.predict, ("setup",), "predict")
            names = inspect.signature(self.predict).parameters
            if "world_size" not in names or names["world_size"].kind is not inspect.Parameter.KEYWORD_ONLY:
                out.append("predict must take keyword-only world_size")
            rank = inspect.signature(self.on_rank).parameters if self.on_rank else {}
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in rank.values()):
                extra = sorted(set(names) - {"setup", "world_size"} - set(rank))
                if extra:
                    out.append(f"predict takes options on_rank does not: {extra}")
        return out


def _options_after(fn: Callable, positional: tuple[str, ...], what: str) -> list[str]:
    """Problems unless ``fn``'s parameters are ``positional`` (in order), then keyword-only ones."""
    params = list(inspect.signature(fn).parameters.values())
    head = tuple(p.name for p in params[: len(positional)])
    if head != positional or any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params[: len(head)]):
        return [f"{what} must start ({', '.join(positional)}), got ({', '.join(head)})"]
    rest = [p.name for p in params[len(positional) :] if p.kind not in (p.KEYWORD_ONLY, p.VAR_KEYWORD)]
    return (
        [f"{what} takes {rest} positionally: after ({', '.join(positional)}) every option is keyword-only"]
        if rest
        else []
    )


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
