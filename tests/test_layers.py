"""The house rules of docs/architecture.md, read from the code's own imports (module level and inside functions).

1. The method layer (pure math and the methods) imports no Ray, no I/O layer, no service.
2. The data plane imports nothing of the model, the methods or the service.
3. The service never imports an entry point (``ncdlr.commands``, ``ncdlr.cli``, ``ncdlr.train_inat2k``).
4. No module imports another that imports it back, directly or through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ncdlr"

METHOD_LAYER = ("ncdlr.prototypes", "ncdlr.ot", "ncdlr.priors", "ncdlr.labeler", "ncdlr.labeler_fast", "ncdlr.buffer",
                "ncdlr.method_settings",
                "ncdlr.losses", "ncdlr.metrics", "ncdlr.estimate_k", "ncdlr.methods")
DATA_LAYER = ("ncdlr.data",)
ENTRY_POINTS = ("ncdlr.commands", "ncdlr.cli", "ncdlr.train_inat2k")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved), anywhere in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return out


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: {t for t in imports_of(path) if t in MODULES and t != name} for name, path in MODULES.items()}


def in_group(name: str, group: tuple[str, ...]) -> bool:
    return any(name == g or name.startswith(g + ".") for g in group)


@pytest.mark.parametrize("name", [m for m in MODULES if in_group(m, METHOD_LAYER)])
def test_the_method_layer_imports_no_ray_no_data_and_no_service(name):
    bad = sorted(t for t in imports_of(MODULES[name])
                 if t.split(".")[0] in ("ray", "pyarrow", "boto3")
                 or (t.startswith("ncdlr.") and not in_group(t, METHOD_LAYER) and t != "ncdlr"))
    assert not bad, f"{name} imports {bad}"


@pytest.mark.parametrize("name", [m for m in MODULES if in_group(m, DATA_LAYER)])
def test_the_data_plane_imports_nothing_of_the_model_or_the_service(name):
    bad = sorted(t for t in imports_of(MODULES[name]) if t.startswith("ncdlr.") and not in_group(t, DATA_LAYER))
    assert not bad, f"{name} imports {bad}"


@pytest.mark.parametrize("name", [m for m in MODULES if in_group(m, ("ncdlr.service", "ncdlr.models"))])
def test_the_service_never_imports_an_entry_point(name):
    bad = sorted(t for t in imports_of(MODULES[name]) if in_group(t, ENTRY_POINTS))
    assert not bad, f"{name} imports {bad}"


def test_no_import_circles():
    """Tarjan's strongly connected components over all ``ncdlr`` imports: each must be a single module
    (a package's ``__init__`` that re-exports its own modules is not a circle of ideas, so edges from a
    package to its own submodules are left out)."""
    graph = {n: {t for t in ts if not t.startswith(n + ".")} for n, ts in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not circles, f"import circles: {circles}"
