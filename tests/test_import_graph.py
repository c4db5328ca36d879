"""The package's import graph, lazy (function-level) imports included: no module may reach itself.

A cycle dodged by an import inside a function still ties the modules together (neither can be read,
tested or moved alone), so every ``import playbook...`` counts, wherever it sits. ``KNOWN`` lists the
cycles not yet taken apart; the test fails on any other cycle, and on a listed one that no longer
exists (so the list only shrinks, and says exactly what is left)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import playbook

ROOT = Path(playbook.__file__).parent

# theory's cycle (activations, memory, moe, stages, tp, ...) went with theory.inventory
KNOWN: set[frozenset[str]] = set()


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@cache
def import_graph() -> dict[str, set[str]]:
    """{module: the playbook modules it imports}, a name resolved to the longest module it names."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.startswith("playbook") else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan 1972), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.add(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.add(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == {frozenset("abc")}
    assert cycles({"a": {"b"}, "b": set()}) == set()


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "playbook.parallel.training" in graph["playbook.parallel.tp.native"]  # a top-level import
    assert "playbook.parallel.tp.model" in graph["playbook.parallel.hybrid.parallelize"]  # inside parallelize()


def test_no_import_cycle_but_the_known_ones_and_every_known_one_still_exists():
    found = cycles(import_graph())
    new = found - KNOWN
    assert not new, "new import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = KNOWN - found
    assert not gone, "cycles gone, remove them from KNOWN: " + "; ".join(" <-> ".join(sorted(c)) for c in gone)
