"""The package's import graph, lazy (function-level) imports included: layers that imports never climb,
and no cycle between modules or between the groups they form.

Every ``import playbook...`` counts, wherever it sits: a cycle or a climb dodged by an import inside a
function still ties the modules together (neither can be read, tested or moved alone).

Three layer tables, one per level of the package (a lower number is lower; a module may import its own
layer and below, never above):

- the top-level packages: configure < cluster, theory < model < measure < parallel < serve, viz <
  book, cli, exercises (``TOP``);
- ``theory``'s groups: cost, inventory < one strategy each < hybrid < plan, serving (``THEORY``);
- ``parallel``'s folders: the spine < a folder per strategy < checkpoint < hybrid and step_time (``PARALLEL``).

``KNOWN`` lists the climbs and cycles not yet taken apart; the tests fail on any other, and on a listed
one that no longer exists (so the list only shrinks, and says exactly what is left)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import playbook

ROOT = Path(playbook.__file__).parent

CONFIGURE = ("config", "hardware", "validate", "hf_config", "dims", "data")
TOP = {
    **dict.fromkeys(CONFIGURE, 0),
    "cluster": 1,
    "theory": 1,
    "model": 2,
    "measure": 3,
    "parallel": 4,
    "serve": 5,
    "viz": 5,
    "book": 6,
    "cli": 6,
    "exercises": 6,
}
THEORY = {
    "cost": 0,
    "inventory": 0,
    "topology": 1,
    "dp": 1,
    "zero": 1,
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "moe": 1,
    "hybrid": 2,
}
THEORY |= {"life": 1}  # checkpoints, failures and goodput at scale (chapter 10): reads inventory only
THEORY |= {"checkpoint": 2}  # a rank's pieces of every tensor, from the layout (pp's chunks)
THEORY |= {"plan": 3, "serving": 3}
SPINE = ("training", "comm", "parity", "report", "registry", "mixed", "grads", "tied", "clip")
PARALLEL = {**dict.fromkeys(SPINE, 0), **dict.fromkeys(("single", "dp", "zero", "tp", "pp", "cp", "ep"), 1)}
PARALLEL |= {"valid_tokens": 1, "reduce_precision": 1}  # chapter 8's step synchronisation, on the spine
PARALLEL |= {"loader": 0}  # a DataLoader on each rank (chapter 10): the spine, beside the loop it feeds
PARALLEL |= {"checkpoint": 2}  # DCP of any layout: the hybrid hooks it in, so it sits below
PARALLEL |= {"hybrid": 3, "step_time": 3}
EXEMPT = {"playbook", "playbook.__main__"}  # the package's face and ``python -m playbook``

KNOWN_CLIMBS: set[tuple[str, str]] = set()
KNOWN_CYCLES: set[frozenset[str]] = set()


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
                # ``from pkg import mod`` imports mod (and runs pkg's __init__, which is pkg's business)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.startswith("playbook") else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def place(mod: str) -> list[tuple[str, str, int]]:
    """Where ``mod`` sits in each table that covers it: [(table, its group there, the group's layer)]."""
    parts = mod.split(".")
    if mod in EXEMPT:
        return []
    top = parts[1]
    out = [("top", top, TOP[top])]
    if top == "theory" and len(parts) > 2:
        out.append(("theory", parts[2], THEORY[parts[2]]))
    if top == "parallel" and len(parts) > 2:
        out.append(("parallel", parts[2], PARALLEL[parts[2]]))
    return out


def climbs(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every (importer, imported) whose imported group sits above the importer's in a shared table; in
    theory, also one strategy's group importing another's (they share layer 1 and must not lean on
    each other)."""
    found = set()
    for mod, targets in graph.items():
        mine = {table: (group, layer) for table, group, layer in place(mod)}
        for target in targets:
            for table, group, layer in place(target):
                if table not in mine or mine[table][0] == group:
                    continue
                if layer > mine[table][1] or (table == "theory" and layer == mine[table][1]):
                    found.add((mod, target))
    return found


def groups_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between groups: a top-level package, or a theory group, or a parallel folder."""

    def group(mod: str) -> str | None:
        where = place(mod)
        return None if not where else ".".join(["playbook", *[g for _, g, _ in where]])

    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        a = group(mod)
        if a is None:
            continue
        out.setdefault(a, set())
        for t in targets:
            b = group(t)
            if b and b != a and not b.startswith(a + ".") and not a.startswith(b + "."):
                out[a].add(b)
    return out


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one node (Tarjan 1972), iteratively."""
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
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == {frozenset("abc")}
    assert cycles({"a": {"b"}, "b": set()}) == set()


def test_the_climb_finder_finds_planted_climbs():
    planted = {
        "playbook.theory.cost.comm": {"playbook.theory.plan.cost"},  # layer 0 -> 3 in theory
        "playbook.theory.tp.tp": {"playbook.theory.pp.schedules"},  # one strategy's group -> another's
        "playbook.cluster.rank": {"playbook.parallel.comm"},  # cluster (1) -> parallel (4)
        "playbook.parallel.grads": {"playbook.parallel.tp.model"},  # the spine -> a strategy folder
        "playbook.parallel.tp.moe": {"playbook.parallel.ep.layers"},  # two strategy folders: allowed
        "playbook.viz.plan": {"playbook.theory.plan.cost", "playbook.parallel.hybrid.run"},  # down: allowed
    }
    assert climbs(planted) == {
        ("playbook.theory.cost.comm", "playbook.theory.plan.cost"),
        ("playbook.theory.tp.tp", "playbook.theory.pp.schedules"),
        ("playbook.cluster.rank", "playbook.parallel.comm"),
        ("playbook.parallel.grads", "playbook.parallel.tp.model"),
    }


def test_every_module_has_a_place_in_the_tables():
    unplaced = []
    for mod in modules():
        try:
            place(mod)
        except (KeyError, IndexError):
            unplaced.append(mod)
    assert not unplaced, f"add these to a layer table (TOP, THEORY, PARALLEL): {unplaced}"


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "playbook.parallel.training" in graph["playbook.parallel.tp.native"]  # a top-level import
    assert "playbook.parallel.tp.model" in graph["playbook.parallel.hybrid.parallelize"]  # inside parallelize()


def test_no_import_climbs_a_layer_but_the_known_ones_and_every_known_one_still_does():
    found = climbs(import_graph())
    new = found - KNOWN_CLIMBS
    assert not new, "imports that climb a layer: " + "; ".join(f"{a} -> {b}" for a, b in sorted(new))
    gone = KNOWN_CLIMBS - found
    assert not gone, "climbs gone, remove them from KNOWN_CLIMBS: " + "; ".join(f"{a} -> {b}" for a, b in gone)


def test_no_import_cycle_between_modules_or_groups_but_the_known_ones():
    found = cycles(import_graph()) | cycles(groups_graph(import_graph()))
    new = found - KNOWN_CYCLES
    assert not new, "new import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = KNOWN_CYCLES - found
    assert not gone, "cycles gone, remove them from KNOWN_CYCLES: " + "; ".join(" <-> ".join(sorted(c)) for c in gone)
