"""The package's import graph: no cycles between modules, and every import points down the layer order.

The graph is read from the source (AST), not by importing: every ``import`` / ``from … import`` anywhere in a
module counts — module level, inside functions (lazy imports) and under ``TYPE_CHECKING`` — because a cycle hidden
behind a lazy import is still a cycle in the design. ``from pkg import name`` is an edge to ``pkg.name`` when that
is a module and to ``pkg`` (its ``__init__``, a re-export) otherwise; a package's ``__init__`` has edges to what it
imports. Importing ``a.b.c`` first runs ``a/__init__`` and ``a/b/__init__``, so it is also an edge to each of
those packages — except the importer's own enclosing packages, which Python has already started by the time the
importer runs (else every package that re-exports a submodule would form a cycle with it). That is the edge by
which, say, ``engine/base.py`` importing ``engine/folded/stats.py`` would loop through ``engine/folded/__init__``.

A type-only reference to a higher layer is still an upward import: type the value by what the lower layer needs
(a ``Protocol``, ``Any``), or move the check or the type to the layer that knows it (as ``DraftGraph.check`` did).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "specfold"

# Bottom to top. A module may import modules of its own layer or of a lower one, never of a higher one. A name
# matches a module and everything under it; the most specific name wins.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("specfold.config", "specfold.validation", "specfold.io", "specfold.timing"),  # dataclasses, checks, files, timing
    ("specfold.model",),  # the transformer, checkpoints, caches, families
    ("specfold.engine",),  # verification executors (dense, folded torch / triton)
    ("specfold.decoding",),  # unmasking, draft graphs, the decoding loop
    ("specfold.api", "specfold"),  # the public API; the package root re-exports it
    ("specfold.eval",),  # tasks, scoring, harness, sweeps, plots
    ("specfold.bench", "specfold.train"),  # timing; the toy-model trainer
    ("specfold.serve",),  # the HTTP server
    ("specfold.cli",),  # the only place that prints
)

def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``) for every module under ``src/specfold``."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The specfold modules ``name`` imports (see the module docstring for what counts)."""
    path, package = MODULES[name]
    here = name if package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . / .. import
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    enclosing = {name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)}
    packages = {m.rsplit(".", i)[0] for m in found for i in range(1, m.count(".") + 1)}
    return {m for m in found | (packages - enclosing) if m in MODULES and m != name}


GRAPH = {name: _imports(name) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one cycle through them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, set(c)) for c in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the first module of a strongly connected component (breadth-first), for the
    message: ``a -> b -> c -> a``."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def _layer(name: str) -> int:
    best, level = -1, -1
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


def test_the_walker_sees_every_kind_of_import() -> None:
    """The graph is only as good as the parser: a function-local import, a ``from pkg import submodule`` and a
    package ``__init__``'s re-export each give an edge."""
    assert "specfold.engine.triton_backend" in GRAPH["specfold.engine.folded"]  # lazy, inside a method
    assert "specfold.api" in GRAPH["specfold"]  # the package root re-exports the API
    assert "specfold.engine.folded" in GRAPH["specfold.engine"]  # engine/__init__ re-exports FoldedVerifier
    assert {"specfold.engine.gate", "specfold.engine.attention_rows"} <= GRAPH["specfold.engine.reference"]
    assert "specfold.engine" in GRAPH["specfold.decoding.decoder"]  # importing engine.base runs engine/__init__
    assert "specfold.engine" not in GRAPH["specfold.engine.dense"]  # its own package: already started
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_module_has_a_layer() -> None:
    assert not [m for m in MODULES if _layer(m) < 0]


def test_imports_point_down() -> None:
    up = [f"{name} (layer {_layer(name)}) imports {m} (layer {_layer(m)})"
          for name in sorted(MODULES) for m in sorted(GRAPH[name]) if _layer(m) > _layer(name)]
    assert not up, "upward imports:\n" + "\n".join(up)
