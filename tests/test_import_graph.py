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
import re
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


# Module-level settings: public UPPER_CASE names of the package's modules. None is assigned from outside its module at
# run time (``module.NAME = ...``, ``setattr(module, "NAME", ...)``, ``monkeypatch.setattr(module, "NAME", ...)``): a
# tunable is data passed down (``variants.w4a16_plan.PlanSettings``), never a global that tests or scripts change.
SETTING = re.compile(r"^[A-Z][A-Z0-9_]*$")
SCANNED = ("sglang_glm5", "kernels", "patches", "loadtest", "tests", "bench", "scripts", "tools")

# (file, module, name) assigned from outside today, with the reason. Empty: a new assignment fails.
KNOWN_SETTING_ASSIGNMENTS: set[tuple[str, str, str]] = set()


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _module_of(expr: ast.expr, bound: dict[str, str], mods: dict[str, Path]) -> str | None:
    """The package module ``expr`` names (through the names the file bound by its imports), or None."""
    name = _dotted(expr)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    full = ".".join([bound[head], rest]) if head in bound and rest else bound.get(head, name)
    return full if full in mods else None


def setting_assignments(root: Path = ROOT) -> set[tuple[str, str, str]]:
    """(file, module, NAME) for each assignment of a package module's setting outside that module."""
    mods = package_modules(root)
    found = set()
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")) if (root / folder).is_dir() else []:
            try:
                tree = ast.parse(path.read_text(), filename=str(path))
            except SyntaxError:
                continue
            rel = str(path.relative_to(root))
            own = next((m for m, p in mods.items() if p == path), None)
            bound: dict[str, str] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name in mods and alias.asname:
                            bound[alias.asname] = alias.name
                elif isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        if f"{node.module}.{alias.name}" in mods:
                            bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"

            for node in ast.walk(tree):
                targets = []
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and SETTING.match(target.attr):
                        module = _module_of(target.value, bound, mods)
                        if module is not None and module != own:
                            found.add((rel, module, target.attr))
                if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Name) and node.func.id == "setattr")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "setattr")
                ):
                    args = node.args
                    if len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
                        module = _module_of(args[0], bound, mods)
                        if module is not None and module != own and SETTING.match(args[1].value):
                            found.add((rel, module, args[1].value))
                    elif args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                        module, _, name = args[0].value.rpartition(".")  # monkeypatch.setattr("pkg.mod.NAME", v)
                        if module in mods and SETTING.match(name):
                            found.add((rel, module, name))
    return found


SETTINGS_ASSIGNED = setting_assignments()


def test_no_module_setting_is_assigned_from_outside_its_module():
    new = sorted(SETTINGS_ASSIGNED - KNOWN_SETTING_ASSIGNMENTS)
    assert not new, "module settings assigned from outside (pass a settings object instead): " + ", ".join(
        f"{file} sets {module}.{name}" for file, module, name in new
    )


def test_every_known_setting_assignment_is_still_there():
    stale = sorted(KNOWN_SETTING_ASSIGNMENTS - SETTINGS_ASSIGNED)
    assert not stale, f"stale KNOWN_SETTING_ASSIGNMENTS entries (remove them): {stale}"


def test_the_scan_catches_each_form_of_assignment(tmp_path):
    """The check above can fail: each form of an assignment from outside, and a module's own assignment left alone."""
    pkg = tmp_path / "sglang_glm5"
    (pkg / "variants").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "variants" / "__init__.py").write_text("")
    (pkg / "variants" / "plan.py").write_text("CHAINS = 2\n\ndef f():\n    global CHAINS\n    CHAINS = 3\n")
    (pkg / "user.py").write_text("from sglang_glm5.variants import plan\nplan.CHAINS = 4\n")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        "import sglang_glm5.variants.plan as p\nfrom sglang_glm5 import variants\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(p, 'CHAINS', 1)\n    setattr(variants.plan, 'SPAN', None)\n"
        "    monkeypatch.setattr('sglang_glm5.variants.plan.EAGER', True)\n    p.cache_ = {}\n"
        "    monkeypatch.setattr(p, '_PRIVATE_CACHE', {})\n"
    )
    assert setting_assignments(tmp_path) == {
        ("sglang_glm5/user.py", "sglang_glm5.variants.plan", "CHAINS"),
        ("tests/test_x.py", "sglang_glm5.variants.plan", "CHAINS"),
        ("tests/test_x.py", "sglang_glm5.variants.plan", "SPAN"),
        ("tests/test_x.py", "sglang_glm5.variants.plan", "EAGER"),
    }


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def arrows_back_up(graph: dict[str, set[str]], layer: str = "sglang_glm5.variants") -> list[tuple[str, str]]:
    """(a module of ``layer``, a module outside it that it imports) where the latter imports ``layer`` itself,
    directly or through others: the kernel families sit below the modules that pick among them (``moe``,
    ``autotune``, ``cli``), which pass down what a family needs."""
    inside = {m for m in graph if m == layer or m.startswith(layer + ".")}
    return sorted(
        (module, above) for module in inside for above in graph[module] - inside if _reaches(graph, above) & inside
    )


def test_no_arrow_back_up_from_the_kernel_families():
    assert not arrows_back_up(GRAPH), "a variants module imports a module that imports variants"


def test_the_layer_check_catches_an_arrow_back_up():
    graph = {
        "sglang_glm5.variants": set(),
        "sglang_glm5.variants.w4a16": {"sglang_glm5.autotune"},
        "sglang_glm5.autotune": {"sglang_glm5.variants", "sglang_glm5.tiles"},
        "sglang_glm5.tiles": set(),
    }
    assert arrows_back_up(graph) == [("sglang_glm5.variants.w4a16", "sglang_glm5.autotune")]
    graph["sglang_glm5.variants.w4a16"] = {"sglang_glm5.tiles"}
    assert arrows_back_up(graph) == []
