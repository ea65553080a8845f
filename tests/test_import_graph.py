"""The package's import graph, read with ``ast``: no import cycles, no cross-module use of private names.

Every ``import`` counts, at module level or inside a function: a lazy import only hides a cycle.
Modules: ``sglang_glm5/`` (with ``sglang_glm5/variants/``), and ``kernels/``, ``patches/``, ``loadtest/``,
``configs/`` as installed under ``sglang_glm5.*`` (pyproject's package-dir). A private name is one with a
leading underscore (not a dunder), imported from another module of the package (``from m import _x``) or read from a
module bound by an import (``m._x``); a private module (``sglang_glm5._files``) is the package's own
and may be imported by its modules.

Known violations live in the allow-lists below, each with the reason and what removes it. A stale
entry (the edge no longer exists or no longer closes a cycle; the private use is gone) fails the test,
so the lists shrink as the code is fixed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "sglang_glm5": "sglang_glm5",
    "sglang_glm5/variants": "sglang_glm5.variants",
    "kernels": "sglang_glm5.kernels",
    "patches": "sglang_glm5.patches",
    "loadtest": "sglang_glm5.loadtest",
    "configs": "sglang_glm5.configs",
}

# Import edges (importer, imported) that close a cycle today, with the reason. Empty: a new cycle fails.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()

# Private names used across modules: (user, owner, name), with the reason. Empty: a new use fails.
KNOWN_PRIVATE_USES: set[tuple[str, str, str]] = set()


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """{installed module name: source file} for every module of the package."""
    mods = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).glob("*.py")):
            mods[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return mods


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module a ``from ... import`` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def read_imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], set[tuple[str, str, str]]]:
    """(the import graph {module: modules it imports}, the private uses {(user, owner, name)})."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    private: set[tuple[str, str, str]] = set()
    for module, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        bound: dict[str, str] = {}  # local name -> package module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in mods:
                        graph[module].add(alias.name)
                        if alias.asname:
                            bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, node, path.stem == "__init__")
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if full in mods:  # from package import module
                        graph[module].add(full)
                        bound[alias.asname or alias.name] = full
                    elif source in mods:
                        graph[module].add(source)
                        if _is_private(alias.name):
                            private.add((module, source, alias.name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _is_private(node.attr):
                owner = bound.get(node.value.id)
                if owner is not None and owner != module:
                    private.add((module, owner, node.attr))
        graph[module].discard(module)
    return graph, private


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None when the graph has none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _without(graph: dict[str, set[str]], edges: set[tuple[str, str]]) -> dict[str, set[str]]:
    return {m: {n for n in targets if (m, n) not in edges} for m, targets in graph.items()}


GRAPH, PRIVATE = read_imports(package_modules())


def test_the_graph_sees_the_whole_package():
    """Guards the reader itself: it finds the modules and the imports between them."""
    some = {"sglang_glm5.moe", "sglang_glm5.kernels.nvfp4_moe", "sglang_glm5.patches", "sglang_glm5.loadtest.cli"}
    assert some <= set(GRAPH)
    # `from sglang_glm5.kernels import nvfp4_moe`, `from sglang_glm5.variants import w4a16` (a subpackage)
    assert "sglang_glm5.kernels.nvfp4_moe" in GRAPH["sglang_glm5.variants.w4a16"]
    assert "sglang_glm5.variants.w4a16" in GRAPH["sglang_glm5.moe"]
    assert "sglang_glm5.hardware" in GRAPH["sglang_glm5.autotune"]  # `from sglang_glm5.hardware import ...`
    assert "sglang_glm5.patches.guard" in GRAPH["sglang_glm5.doctor"]  # a function-level import


def test_no_import_cycles_but_the_known_ones():
    cycle = find_cycle(_without(GRAPH, KNOWN_CYCLE_EDGES))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_known_cycle_edge_still_closes_a_cycle():
    """An allow-listed edge that is gone, or no longer part of a cycle, must leave the list."""
    for edge in sorted(KNOWN_CYCLE_EDGES):
        importer, imported = edge
        assert imported in GRAPH[importer], f"stale KNOWN_CYCLE_EDGES entry {edge}: {importer} no longer imports it"
        # Without the other known edges the graph is acyclic (the test above), so any cycle uses this edge.
        back = find_cycle(_without(GRAPH, KNOWN_CYCLE_EDGES - {edge}))
        assert back is not None and any(back[i : i + 2] == [importer, imported] for i in range(len(back) - 1)), (
            f"stale KNOWN_CYCLE_EDGES entry {edge}: it closes no cycle any more"
        )


def test_no_cross_module_private_names_but_the_known_ones():
    new = sorted(PRIVATE - KNOWN_PRIVATE_USES)
    assert not new, "private names used across modules (make them public or move them): " + ", ".join(
        f"{user} uses {owner}.{name}" for user, owner, name in new
    )


def test_every_known_private_use_is_still_there():
    stale = sorted(KNOWN_PRIVATE_USES - PRIVATE)
    assert not stale, f"stale KNOWN_PRIVATE_USES entries (remove them): {stale}"


def test_the_reader_catches_a_cycle_and_a_private_import(tmp_path):
    """The checks above can fail: a small package with a lazy-import cycle and a private import."""
    pkg = tmp_path / "sglang_glm5"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from sglang_glm5.b import _hidden\n")
    (pkg / "b.py").write_text("def f():\n    from sglang_glm5 import a\n    return a._x\n_hidden = 1\n")
    graph, private = read_imports(package_modules(tmp_path))
    assert find_cycle(graph) in (["sglang_glm5.a", "sglang_glm5.b", "sglang_glm5.a"],
                                 ["sglang_glm5.b", "sglang_glm5.a", "sglang_glm5.b"])  # fmt: skip
    assert private == {("sglang_glm5.a", "sglang_glm5.b", "_hidden"), ("sglang_glm5.b", "sglang_glm5.a", "_x")}
