"""Every strategy has the one shape (rank entry, prediction in theory/, flags, run), and listing
them imports none of them."""

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


def test_a_strategy_with_a_positional_boolean_is_caught():
    from playbook.parallel.registry import Strategy

    def run(setup, *, world_size, backend="auto"):
        return None

    def on_rank(ctx, setup, sequence_parallel=False):
        return None

    from playbook.theory.hybrid.memory import training_memory

    problems = Strategy("x", run, "", on_rank=on_rank, predict=training_memory).problems()
    assert problems == ["on_rank takes positional booleans ['sequence_parallel']: make them keyword-only"]
    assert "predict=" in " ".join(Strategy("x", run, "", on_rank=on_rank, predict=print).problems())


def test_listing_the_strategies_imports_none_of_them():
    code = (
        "import sys; from playbook.parallel.registry import names; names(); "
        "print([m for m in sys.modules if m.startswith('playbook.parallel.') and m != 'playbook.parallel.registry'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported = set(eval(out.strip()))  # a list of module names
    assert imported <= {"playbook.parallel.report", "playbook.parallel.training"}, imported
