"""Every strategy has the one shape (``on_rank(ctx, setup, **options)``, ``predict(setup, *,
world_size, **options)``, flags, ``run(setup, *, world_size, backend, launch, **options) -> Report``),
the generic caller's cases fit it, and listing the strategies imports none of them."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from playbook.parallel.registry import STRATEGY_MODULES, get, names

PACKAGE = Path(__file__).resolve().parents[2] / "playbook"


@pytest.mark.parametrize("name", names())
def test_every_registered_strategy_has_the_one_shape(name):
    strategy = get(name)
    assert strategy.name == name and strategy.problems() == []
    if strategy.arguments is not None:  # its flags go on a parser without clashing with the common ones
        parser = argparse.ArgumentParser()
        parser.add_argument("--world-size", type=int)
        strategy.arguments(parser)


def test_the_module_table_lists_every_module_that_registers_a_strategy():
    registering = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        for p in PACKAGE.rglob("*.py")
        if re.search(r"^@register\(", p.read_text(), flags=re.M)
    }
    assert registering == set(STRATEGY_MODULES.values())


def test_a_strategy_off_the_shape_is_caught():
    from playbook.parallel.registry import Strategy
    from playbook.parallel.report import RunReport

    def run(setup, *, world_size, backend="auto", launch=None) -> RunReport: ...

    def on_rank(ctx, setup, *, sequence_parallel=False): ...

    def predict(setup, *, world_size, sequence_parallel=False): ...

    assert Strategy("x", run, "", on_rank=on_rank, predict=predict).problems() == []

    def positional(ctx, setup, cfg, *, sequence_parallel=False): ...  # ep's old cfg, hybrid's old Plan

    def no_setup(ctx, *, cfg): ...  # serving's rank function as it was

    def run_no_launch(setup, *, world_size, backend="auto") -> RunReport: ...

    def run_returns_dict(setup, *, world_size, backend="auto", launch=None) -> dict: ...

    def predict_other_options(setup, *, world_size, m): ...

    def problems(**kw):
        return Strategy("x", **{"run": run, "help": "", "on_rank": on_rank, "predict": predict, **kw}).problems()

    assert problems(on_rank=positional) == [
        "on_rank takes ['cfg'] positionally: after (ctx, setup) every option is keyword-only"
    ]
    assert problems(on_rank=no_setup, predict=None) == ["on_rank must start (ctx, setup), got (ctx, cfg)"]
    assert problems(run=run_no_launch) == ["run must take keyword-only launch"]
    assert problems(run=run_returns_dict)[0].startswith("run must return a Report")
    assert problems(predict=predict_other_options) == ["predict takes options on_rank does not: ['m']"]


def test_every_step_time_case_fits_its_strategys_on_rank_and_predict():
    """The one generic caller (``parallel.step_time``) calls ``on_rank(ctx, setup, **options)`` and
    ``predict(setup, world_size=n, **options)`` with each case's options, never by name."""
    import inspect

    from playbook.parallel.step_time import CASES, predicted_bytes
    from playbook.parallel.training import TrainSetup

    setup = TrainSetup()
    for label, (name, options, sizes) in CASES.items():
        strategy = get(name)
        inspect.signature(strategy.on_rank).bind("ctx", setup, **options)  # TypeError if it does not fit
        want = predicted_bytes(name, setup, sizes[0], options)
        assert (want is None) == (strategy.predict is None), label
        assert want is None or (want and all(isinstance(b, float) and b > 0 for b in want.values())), (label, want)


@pytest.mark.parametrize("name", names())
def test_every_run_starts_its_ranks_through_the_launch_it_is_given(name):
    """``run(..., launch=L)`` starts every rank through ``L`` (the command's timeout, progress bar and
    traces travel in it, not in module globals): a launcher that refuses to start stops the run at
    its first launch. The options are the strategy's own flags' defaults, as ``playbook run`` passes them."""
    from playbook.parallel.training import TrainSetup

    strategy = get(name)
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=1 if name == "single" else 2)
    if strategy.arguments:
        strategy.arguments(parser)
    options = vars(parser.parse_args([]))
    world = options.pop("world_size") or strategy.world_size(options)
    calls = []

    class Refused(Exception):
        pass

    def refuse(fn, world_size=None, *args, **kwargs):
        calls.append((fn, world_size))
        raise Refused

    with pytest.raises(Refused):
        strategy.run(TrainSetup(), world_size=world, backend="gloo", launch=refuse, **options)
    assert calls and calls[0][1] == world


def test_listing_the_strategies_imports_none_of_them():
    code = (
        "import sys; from playbook.parallel.registry import names; names(); "
        "print([m for m in sys.modules if m.startswith('playbook.parallel.') and m != 'playbook.parallel.registry'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported = set(eval(out.strip()))  # a list of module names
    assert imported <= {"playbook.parallel.report", "playbook.parallel.training"}, imported
