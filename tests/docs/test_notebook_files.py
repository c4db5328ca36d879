"""The chapters as committed: every cell has a unique id (nbformat 4.5; nbmake and JupyterLab warn,
and a future nbformat refuses, a cell without one), and nothing ran (no outputs, no execution counts)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def problems(nb: dict) -> list[str]:
    ids = [c.get("id") for c in nb["cells"]]
    out = [f"cell {i} has no id" for i, x in enumerate(ids) if not x]
    out += [f"id {x!r} is used twice" for x in {x for x in ids if x and ids.count(x) > 1}]
    out += [f"cell {i} was committed with outputs" for i, c in enumerate(nb["cells"]) if c.get("outputs")]
    out += [f"cell {i} has an execution count" for i, c in enumerate(nb["cells"]) if c.get("execution_count")]
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_cell_has_a_unique_id_and_no_outputs(path):
    assert problems(json.loads(path.read_text())) == []


def test_the_checker_sees_a_cell_without_an_id_and_a_ran_cell():
    nb = {"cells": [{"id": "a", "outputs": []}, {"outputs": [{"text": "x"}], "execution_count": 3}, {"id": "a"}]}
    assert problems(nb) == [
        "cell 1 has no id",
        "id 'a' is used twice",
        "cell 1 was committed with outputs",
        "cell 1 has an execution count",
    ]
