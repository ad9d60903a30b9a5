"""No import cycles among the modules of ``torch_lattice``.

The graph is read from the source with ``ast`` (nothing is imported).  Its nodes are the
modules under ``torch_lattice/`` (a package is its ``__init__.py``); its edges are every
import statement a module runs, anywhere in the file: top level, and inside functions
and methods (a lazy import still closes a cycle, only later).  Rules:

- ``import a.b.c`` is an edge to ``a.b.c``.
- ``from a.b import y`` is an edge to ``a.b.y`` when ``y`` is a submodule of ``a.b`` (a
  ``.py`` file or a package beside it), or when ``a/b/__init__.py`` binds no name ``y`` at
  its top level (then ``y`` can only come from a module outside the sources, such as the
  compiled ``torch_lattice._C``); otherwise it is an edge to ``a.b`` itself, the
  ``__init__`` that defines ``y``.
- Relative imports are resolved against the importing module's package first.
- Imports under ``if TYPE_CHECKING:`` are left out: they never run.
- The implicit import of a module's parent packages is not an edge.  Importing
  ``p.s`` runs ``p/__init__.py`` first, so a package whose ``__init__`` imports its own
  submodules would otherwise always be a cycle; it is one only when a submodule
  imports back, by name, something ``p/__init__.py`` defines (``from p import name``
  with ``name`` bound in the ``__init__``): then the rule above draws the edge
  ``p.s -> p``, and ``p -> p.s -> p`` is reported.

A cycle fails the test and is named, e.g. ``torch_lattice.tensor ->
torch_lattice.sparse_ops -> torch_lattice.tensor``.  :func:`find_cycle` is tested on a
tiny graph with a cycle too, so the check can fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "torch_lattice"
PACKAGE = "torch_lattice"


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under ``root``."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, except ``if TYPE_CHECKING:`` bodies."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (definitions, assignments, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def import_graph(files: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``files`` it imports (the rules of the module doc)."""
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in files.items()}
    packages = {name for name, path in files.items() if path.name == "__init__.py"}
    bound = {name: _top_level_names(trees[name]) for name in packages}

    def target(base: str, attr: str) -> str:
        sub = f"{base}.{attr}"
        if sub in files or (base in bound and attr not in bound[base]):
            return sub
        return base

    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        package = name if name in packages else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _runtime_imports(tree):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
                continue
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            edges.update(target(base, alias.name) for alias in node.names)
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found is not None:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found is not None:
                return found
    return None


def test_find_cycle_names_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_graph_rules_on_a_tiny_package(tmp_path: Path) -> None:
    """Lazy and relative imports are edges; a package importing its submodules is not a
    cycle, a submodule importing a name its package's ``__init__`` defines is."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from p.a import f\nVALUE = 1\n")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import f\n"
        "def g():\n    return 0\n"
    )
    files = module_files(pkg, "p")
    graph = import_graph(files)
    assert graph == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": set()}
    assert find_cycle(graph) is None
    (pkg / "b.py").write_text("def g():\n    from p import VALUE\n    return VALUE\n")
    assert find_cycle(import_graph(files)) == ["p", "p.a", "p.b", "p"]


def test_torch_lattice_has_no_import_cycle() -> None:
    graph = import_graph(module_files())
    assert "torch_lattice.tensor" in graph  # the walk found the sources
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())
