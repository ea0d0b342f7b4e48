"""The import graph and module sizes of ``src/dpgate`` (issue 20 step 6, "Done means": no module
over 800 lines, no import cycle).

The graph is computed from the source (``ast``, nothing is imported): an edge ``a → b`` for every
``import``/``from … import`` in module ``a`` that names ``dpgate`` module ``b`` (a name imported
from a package is the submodule when one exists, else the package; relative imports resolved;
as import-linter/grimp do, importing ``a.b.c`` is an edge to ``a.b.c`` only, not to the packages
that Python also initialises). Edges are of three kinds:

* ``module``: executed at import time (module level, including ``try``/``if`` blocks);
* ``function``: inside a function or method body (executed when called: the usual way to
  break a cycle, and a cycle all the same at the design level);
* ``typing``: under ``if TYPE_CHECKING:`` (never executed; not counted).

A *cycle* is a strongly connected component of more than one module; each is listed with one
shortest cycle through its modules as a witness. :data:`MODULE_LEVEL_CYCLES` (module edges only)
and :data:`ALL_CYCLES` (module and function edges) are today's components: a change may shrink
or split them, never add a module to one or make a new one. Both are empty since issue 20 step 6,
and "no cycle at all" is asserted.

Sizes: no module may grow past ``max(800, its size today)`` lines (:data:`OVERSIZED`, today's
modules over 800 lines, empty since issue 20 step 6); no module over 800 is asserted.

Print today's figures (for docs/COMPILE_PROGRESS.md)::

    python tests/test_import_graph.py
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from pathlib import Path


SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "dpgate"
MAX_LINES = 800

#: Today's import cycles over module-level edges (strongly connected components).
MODULE_LEVEL_CYCLES: set[frozenset[str]] = set()  # filled below from the measured baseline
#: Today's import cycles over module-level and function-level edges.
ALL_CYCLES: set[frozenset[str]] = set()
#: Today's modules over 800 lines → their size in lines.
OVERSIZED: dict[str, int] = {}


def modules() -> dict[str, Path]:
    """Dotted module name → file, for every module of the package (``__init__`` as the package)."""
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The dpgate modules an import statement names."""
    def deepest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        for alias in node.names:
            full = f"{prefix}.{alias.name}"
            names.append(full if full in known else prefix)
    out = set()
    for name in names:
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            target = deepest(name)
            if target is not None and target != module:
                out.add(target)
    return out


@functools.cache
def import_edges() -> dict[str, dict[str, frozenset[str]]]:
    """kind ("module", "function", "typing") → module → the modules it imports (computed once)."""
    known = modules()
    names = set(known)
    edges: dict[str, dict[str, set[str]]] = {k: {m: set() for m in known} for k in ("module", "function", "typing")}

    def visit(node: ast.AST, kind: str, module: str, is_package: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                edges[kind][module] |= _targets(child, module, is_package, names)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, "function" if kind == "module" else kind, module, is_package)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                visit(ast.Module(body=child.body, type_ignores=[]), "typing", module, is_package)
                visit(ast.Module(body=child.orelse, type_ignores=[]), kind, module, is_package)
            else:
                visit(child, kind, module, is_package)

    for module, path in known.items():
        visit(ast.parse(path.read_text(), filename=str(path)), "module", module, path.name == "__init__.py")
    return {k: {m: frozenset(v) for m, v in by.items()} for k, by in edges.items()}


def _graph(*kinds: str) -> dict[str, set[str]]:
    edges = import_edges()
    return {m: set().union(*(edges[k][m] for k in kinds)) for m in edges["module"]}


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: set[frozenset[str]] = set()
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.add(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.add(frozenset(component))
    return out


def witness(graph: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """One shortest cycle inside ``component`` (through its alphabetically first module)."""
    start = min(component)
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & component):
            if nxt == start:
                path = [node]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return list(reversed(path)) + [start]
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{sorted(component)} is not a cycle")


def sizes() -> dict[str, int]:
    return {m: len(p.read_text().splitlines()) for m, p in modules().items()}


def _within(found: set[frozenset[str]], baseline: set[frozenset[str]]) -> list[str]:
    """The components of ``found`` that are no subset of a baseline component (new cycles)."""
    return [", ".join(sorted(c)) for c in found if not any(c <= b for b in baseline)]


# --------------------------------------------------------------------------------------
# today's baseline (measured before issue 20's redesign; `python tests/test_import_graph.py`)
# --------------------------------------------------------------------------------------

#: None today: every cycle is closed by an import inside a function.
_MODULE_LEVEL: list[set[str]] = []
_ALL: list[set[str]] = []  # none since issue 20 step 6 (sql.sources took the virtual tables' types)
MODULE_LEVEL_CYCLES.update(frozenset(c) for c in _MODULE_LEVEL)
ALL_CYCLES.update(frozenset(c) for c in _ALL)
OVERSIZED.update({
})


def test_the_graph_sees_the_imports_it_should():
    """The walk is not vacuous: known edges of each kind are found."""
    edges = import_edges()
    assert "dpgate.sql.plan" in edges["module"]["dpgate.sql.parse"]
    assert any(edges["function"].values()) and any(edges["typing"].values())
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    assert witness({"a": {"b"}, "b": {"a", "c"}, "c": {"a"}}, frozenset("abc")) == ["a", "b", "a"]


def test_no_new_module_level_cycle():
    new = _within(cycles(_graph("module")), MODULE_LEVEL_CYCLES)
    assert not new, f"new import cycles at module level: {new}"


def test_no_new_cycle_through_function_level_imports():
    new = _within(cycles(_graph("module", "function")), ALL_CYCLES)
    assert not new, f"new import cycles (module- and function-level imports): {new}"


def test_the_cycle_baseline_is_today():
    """Tight: when a cycle is broken, remove it here (so that it cannot come back)."""
    assert cycles(_graph("module")) == MODULE_LEVEL_CYCLES
    assert cycles(_graph("module", "function")) == ALL_CYCLES


def test_no_import_cycle():
    assert not cycles(_graph("module", "function"))


def test_no_module_grows_past_its_baseline():
    grown = {m: n for m, n in sizes().items() if n > max(MAX_LINES, OVERSIZED.get(m, 0))}
    assert not grown, f"modules over max({MAX_LINES}, their size when issue 20 started): {grown}"


def test_the_size_baseline_lists_todays_oversized_modules():
    """A module brought under 800 lines leaves :data:`OVERSIZED` (its allowance must not stay)."""
    assert set(OVERSIZED) == {m for m, n in sizes().items() if n > MAX_LINES}


def test_no_module_over_800_lines():
    """Issue 20 step 6 reached: no module in src/dpgate has more than 800 lines."""
    assert not {m: n for m, n in sizes().items() if n > MAX_LINES}


def main() -> None:  # pragma: no cover - prints the baseline
    for name, kinds in (("module level", ("module",)), ("module + function level", ("module", "function"))):
        graph = _graph(*kinds)
        found = cycles(graph)
        print(f"{name}: {len(found)} cycle(s)")
        for c in sorted(found, key=lambda c: (-len(c), sorted(c))):
            print(f"  {len(c)} modules: {sorted(c)}")
            print(f"    e.g. {' -> '.join(witness(graph, c))}")
    print("modules over 800 lines:")
    for m, n in sorted(sizes().items(), key=lambda x: -x[1]):
        if n > MAX_LINES:
            print(f"  {m}: {n}")


if __name__ == "__main__":  # pragma: no cover
    main()
