"""No module of the workspace imports itself back through other modules, lazy imports included.

A cycle works in Python as long as one of its imports runs late (inside a function), but it
leaves no layer below the other: the kernels needing the dispatch that calls them, say. Each
package's modules are read as text (`ast`), every import statement counted wherever it stands,
and the graph of module -> module it names must have no cycle. Importing `a.b.c` also runs
`a/__init__` and `a/b/__init__`; those implicit edges are left out, as every submodule would
otherwise close a cycle with its own package's `__init__`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module under packages/*/src and apps/*/src."""
    found = {}
    for src in sorted([*ROOT.glob("packages/*/src"), *ROOT.glob("apps/*/src")]):
        for path in src.rglob("*.py"):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The workspace modules that `name` names in its import statements."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import mod` names a module; else pkg itself
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return {target for target in out if target in modules and target != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_only_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_and_lazy_imports_are_read(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n    from . import c\n")
    (pkg / "c.py").write_text("from pkg.sub.b import g\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nfrom .. import c\n")
    modules = {
        "pkg": pkg / "__init__.py",
        "pkg.a": pkg / "a.py",
        "pkg.c": pkg / "c.py",
        "pkg.sub": pkg / "sub" / "__init__.py",
        "pkg.sub.b": pkg / "sub" / "b.py",
    }
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub.b", "pkg.c"},
        "pkg.c": {"pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.a", "pkg.c"},
    }
    assert _cycle(graph) == ["pkg.a", "pkg.c", "pkg.sub.b", "pkg.a"]


def test_the_workspace_has_no_import_cycle() -> None:
    modules = _modules()
    assert len(modules) > 150, "the source folders were not found"
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    if cycle is not None:
        pytest.fail("import cycle: " + " -> ".join(cycle))
