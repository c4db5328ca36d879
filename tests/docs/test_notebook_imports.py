"""Every ``playbook`` import in the chapters and the README resolves, read statically (no chapter runs):
a module moved or a name renamed is caught here in about a second, not by the slow book run.

A chapter imports package faces: ``from playbook.<layer>.<group> import name`` at most as deep as a group
(``playbook.theory.pp``, ``playbook.parallel.zero``, ``playbook.viz.mesh``), each group's ``__init__``
listing what the chapters use, so that moving a file inside a group is invisible to the chapters."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_DEPTH = 3  # playbook . layer . group


def module_file(mod: str) -> Path | None:
    p = REPO.joinpath(*mod.split("."))
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else None


def names_of(mod: str) -> set[str]:
    """The names ``mod`` binds at its top level: defined, assigned or imported."""
    out: set[str] = set()
    for node in ast.parse(module_file(mod).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def problems(source: str, *, faces: bool) -> list[str]:
    """Why each ``playbook`` import in ``source`` would fail (and, with ``faces``, which go deeper than a group)."""
    source = "\n".join(line for line in source.split("\n") if not line.lstrip().startswith(("%", "!")))
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [
                f"no module {a.name}" for a in node.names if a.name.startswith("playbook") and not module_file(a.name)
            ]
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("playbook"):
            continue
        mod = node.module
        if module_file(mod) is None:
            out.append(f"no module {mod}")
            continue
        if faces and len(mod.split(".")) > MAX_DEPTH:
            out.append(f"{mod} is deeper than a package face: import from {'.'.join(mod.split('.')[:MAX_DEPTH])}")
        out += [
            f"{mod} has no {a.name}"
            for a in node.names
            if not module_file(f"{mod}.{a.name}") and a.name not in names_of(mod)
        ]
    return out


CHAPTERS = sorted((REPO / "notebooks").glob("*.ipynb"))


def readme_sources() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    return [(f"README.md python block {i}", b) for i, b in enumerate(re.findall(r"```python\n(.*?)```", text, re.S))]


def test_the_check_finds_a_moved_module_a_missing_name_and_a_deep_import():
    assert problems("from playbook.theory.plan_cost import OVERLAP_PRESETS", faces=False) == [
        "no module playbook.theory.plan_cost"
    ]
    assert problems("from playbook.theory.pp import no_such_name", faces=True) == [
        "playbook.theory.pp has no no_such_name"
    ]
    deep = problems("from playbook.theory.pp.schedules import make_schedule", faces=True)
    assert deep == ["playbook.theory.pp.schedules is deeper than a package face: import from playbook.theory.pp"]
    assert (
        problems("from playbook.theory.pp import make_schedule\nfrom playbook.parallel import grads", faces=True) == []
    )


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_import_resolves_to_a_package_face(chapter):
    cells = [c for c in json.loads(chapter.read_text())["cells"] if c["cell_type"] == "code"]
    found = [(i, p) for i, c in enumerate(cells) for p in problems("".join(c["source"]), faces=True)]
    assert not found, f"code cell (index among code cells), problem: {found}"


def test_every_readme_import_resolves():
    found = [(where, p) for where, src in readme_sources() for p in problems(src, faces=True)]
    assert not found
