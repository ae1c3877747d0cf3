"""The layers stay one-way: cli, benchmarks, app.py -> app_pages -> ui -> profiling -> engine -> kernels.

The import graph is read from the AST of every module (imports inside functions included), so an arrow that comes
back fails here on the first line that draws it. Beside the order: no module imports another by string
(importlib, __import__) outside cli/, no two modules import each other even through others, the engine imports no
dashboard library, and the records and the report reader load without torch.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Rank of each top-level package: a module may import its own package or a lower rank only.
RANKS = {"kernels": 0, "engine": 1, "profiling": 2, "ui": 3, "app_pages": 4, "app": 5, "cli": 5, "benchmarks": 5}
ENTRY_ALIASES = {"engine.__main__": "cli"}  # `python -m engine` is the alias of `python -m cli`: a command
DASHBOARD_LIBRARIES = ("streamlit", "plotly", "pandas")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, pathlib.Path]:
    files = [ROOT / "app.py", *(p for pkg in RANKS if (ROOT / pkg).is_dir() for p in (ROOT / pkg).rglob("*.py"))]
    return {module_name(p): p for p in files}


def layer_of(module: str) -> str:
    return ENTRY_ALIASES.get(module, module.split(".")[0])


def imported(node: ast.AST, module: str, is_package: bool, modules: frozenset[str] = frozenset()) -> list[str]:
    """The modules an import statement names: `from a import b` names a.b where that is a module, else a."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module
        names = [f"{target}.{alias.name}" for alias in node.names]
        return [name if name in modules else target for name in names]
    return []


def page_routes(tree: ast.AST) -> list[str]:
    """st.Page("app_pages/x.py", ...) routes: Streamlit runs the file, so it is an edge to that module."""
    routes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Page" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.endswith(".py"):
                routes.append(first.value[:-3].replace("/", "."))
    return routes


def import_graph() -> tuple[dict[str, list[tuple[str, int]]], dict[str, list[int]], dict[str, list[str]]]:
    """(edges: module -> [(project module, line)], string imports: module -> [lines], third-party: module -> names)."""
    modules = project_modules()
    edges, by_string, outside = {}, {}, {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        edges[name], by_string[name], outside[name] = [], [], []
        for node in ast.walk(tree):
            for target in imported(node, name, is_package, frozenset(modules)):
                if target in modules and target != name:
                    edges[name].append((target, node.lineno))
                elif target.split(".")[0] not in RANKS:
                    outside[name].append(target)
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in ("import_module", "__import__"):
                    by_string[name].append(node.lineno)
        edges[name] += [(route, 0) for route in page_routes(tree) if route in modules]
    return edges, by_string, outside


EDGES, BY_STRING, OUTSIDE = import_graph()


def test_the_graph_covers_every_layer():
    layers = {layer_of(m) for m in EDGES}
    assert layers == set(RANKS), f"layers found: {sorted(layers)}"
    assert sum(len(v) for v in EDGES.values()) > 300  # the graph was really read


@pytest.mark.parametrize("layer", sorted(RANKS, key=RANKS.get))
def test_imports_point_down(layer):
    wrong = [f"{m}:{line} imports {t}" for m, targets in EDGES.items() if layer_of(m) == layer
             for t, line in targets if layer_of(t) != layer and RANKS[layer_of(t)] >= RANKS[layer]]
    assert not wrong, "arrows that point up or sideways:\n" + "\n".join(wrong)


def test_no_import_by_string_below_cli():
    found = [f"{m}:{line}" for m, lines in BY_STRING.items() if layer_of(m) != "cli" for line in lines]
    assert not found, f"imports by string: {found}"


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph: any component of two or more is a loop."""
    index, low, stack, on_stack, loops = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in EDGES.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(EDGES):
        if v not in index:
            visit(v)
    assert not loops, f"import cycles: {loops}"


def test_the_engine_and_kernels_import_no_dashboard_library():
    found = [f"{m} imports {t}" for m, targets in OUTSIDE.items() if layer_of(m) in ("engine", "kernels")
             for t in targets if t.split(".")[0] in DASHBOARD_LIBRARIES]
    assert not found, found


def test_the_checker_catches_an_arrow_that_comes_back(tmp_path):
    """The checks above see a real upward import: the same reading of a module that imports the dashboard."""
    bad = ast.parse("from ui import state\n\ndef f():\n    import profiling.metrics\n")
    targets = [t for node in ast.walk(bad) for t in imported(node, "engine.x", False, frozenset({"ui.state"}))]
    assert {"ui.state", "profiling.metrics"} <= set(targets)
    assert all(RANKS[t.split(".")[0]] > RANKS["engine"] for t in targets)


@pytest.mark.parametrize("module", ["engine.records", "engine.config", "profiling.report_reader"])
def test_importing_records_and_the_report_reader_needs_no_torch(module):
    """The records, the configs and the report reader import without torch (checking a recording's drafter settings
    loads the drafter registry, which does)."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"importing {module} loads torch"
