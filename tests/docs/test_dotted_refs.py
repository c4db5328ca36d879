"""Every dotted reference to the package in a docstring, a comment, the README or the docs names
something that exists: ``theory.plan.cost.step_cost``, ``playbook.parallel.grads``,
:func:`~playbook.viz.pp_dashboard.pipeline_explorer`. Read statically, in about a second; a reference
left behind by a move or a rename fails here, with the file and the reference."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("theory", "parallel", "measure", "serve", "cluster", "viz", "cli", "book", "exercises", "model")
REF = re.compile(r"`~?((?:playbook\.)?(?:" + "|".join(LAYERS) + r")(?:\.[A-Za-z_][A-Za-z_0-9]*)+)`")


def module_file(mod: str) -> Path | None:
    p = REPO.joinpath(*mod.split("."))
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else None


@cache
def bindings(mod: str) -> dict[str, set[str] | None]:
    """Top-level names of ``mod``: a class maps to the names its body binds, anything else to None."""
    out: dict[str, set[str] | None] = {}
    for node in ast.parse(module_file(mod).read_text()).body:
        if isinstance(node, ast.ClassDef):
            body = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    body.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    body |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            out[node.name] = body
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update({n.id: None for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
    return out


def stale(ref: str) -> str | None:
    """Why ``ref`` names nothing (None when it resolves)."""
    parts = (ref if ref.startswith("playbook.") else f"playbook.{ref}").split(".")
    k = len(parts)
    while k > 1 and module_file(".".join(parts[:k])) is None:
        k -= 1
    mod, rest = ".".join(parts[:k]), parts[k:]
    if k == 1:
        return f"no module {'.'.join(parts[:2])}"
    if not rest:
        return None
    names = bindings(mod)
    if rest[0] not in names:
        return f"{mod} has no {rest[0]}"
    body = names[rest[0]]
    if len(rest) > 1 and body is not None and rest[1] not in body:
        return f"{mod}.{rest[0]} has no {rest[1]}"
    return None


def texts() -> list[tuple[str, str]]:
    out = [(str(p.relative_to(REPO)), p.read_text()) for p in sorted((REPO / "playbook").rglob("*.py"))]
    out += [
        (str(p.relative_to(REPO)), p.read_text()) for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    ]
    return out


def test_the_resolver_tells_a_stale_reference_from_a_good_one():
    assert stale("theory.plan.cost.OVERLAP_PRESETS") is None
    assert stale("playbook.parallel.grads.reduce_gradients") is None
    assert stale("parallel.training.TrainSetup.config") is None  # a method of a class
    assert stale("theory.plan_cost.step_cost") == "playbook.theory has no plan_cost"
    assert stale("theory.plan.cost.no_such_thing") == "playbook.theory.plan.cost has no no_such_thing"
    assert stale("parallel.training.TrainSetup.nope") == "playbook.parallel.training.TrainSetup has no nope"


def test_every_dotted_reference_names_something_that_exists():
    found = [
        f"{where}: ``{m[1]}``: {why}"
        for where, text in texts()
        for m in REF.finditer(text)
        if not m[1].endswith(".py") and (why := stale(m[1]))  # a file name is not a reference
    ]
    assert not found, f"{len(found)} stale references:\n" + "\n".join(found)
