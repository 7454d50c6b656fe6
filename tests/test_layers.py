"""The one-way house: ``src/hfexport`` imports only down its layers, inside functions too, and has no import circle.

The import graph is read with ``ast`` from the sources (every ``import`` / ``from ... import`` anywhere in a module,
function bodies included); a module is placed in the layer of the longest prefix in :data:`LAYERS`. A failure names
the file, the line and the import. Packages above a layer are reached by dotted path through a registry
(``hfexport.registry`` for the backends, ``hfexport.workarounds.registry`` for the built-in workarounds): a string,
not an import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: data flows capture -> trace -> lower -> save -> load -> run; a module imports only from its own layer or lower
LAYERS: dict[str, int] = {
    # 0: typed errors, versions, format names, the cache pytree registration and leaf walk
    "hfexport.errors": 0, "hfexport._versions": 0, "hfexport.formats": 0, "hfexport.pytrees": 0,
    # 1: what is written about an export, and the manifest
    "hfexport.metadata": 1, "hfexport.derived": 1, "hfexport.manifest_schema": 1, "hfexport.manifest": 1,
    # 2: contracts and registries
    "hfexport.quantizers.base": 2, "hfexport.configs": 2, "hfexport.registry": 2, "hfexport.workarounds": 2,
    # 3: capture, signature, runner, quantizers, the workarounds themselves
    "hfexport.capture": 3, "hfexport.signature": 3, "hfexport.runner": 3, "hfexport.quantizers": 3,
    "hfexport.workarounds.registry": 2,
    # 4: the exporter template, the artifact, generation, validation
    "hfexport.exporter": 4, "hfexport.stages": 4, "hfexport.exported": 4, "hfexport.generation": 4,
    "hfexport.validation": 4,
    # 5: the backends, and the workarounds of one backend's lowering
    "hfexport.backends": 5, "hfexport.workarounds.onnx_": 5, "hfexport.workarounds.openvino_": 5,
    "hfexport.workarounds.executorch_": 5, "hfexport.workarounds.quantize_": 5, "hfexport.workarounds.moe_": 5,
    # 6: what users and tools run: the command line, the demo, the matrix, the tiny-model builders, the spec's paths
    "hfexport.cli": 6, "hfexport.testing": 6, "hfexport.tools": 6,
    "hfexport.utils": 6, "hfexport.exporter_": 6, "hfexport": 6,
    "hfexport.hf_model": 1,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p)
                and (p.endswith("_") or module[len(p)] == ".")), key=len)
    return LAYERS[best]


def _imports(path: Path, module: str, known: set[str]) -> list[tuple[int, str, str]]:
    """``(line, imported module, source text)`` for every import of an hfexport module in ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("hfexport") and target != module:
                found.append((node.lineno, target, lines[node.lineno - 1].strip()))
    return found


def _graph() -> dict[str, list[tuple[int, str, str]]]:
    files = {_module_name(p): p for p in (SRC / "hfexport").rglob("*.py")}
    known = set(files)
    return {module: _imports(path, module, known) for module, path in files.items()}


GRAPH = _graph()
FILES = {_module_name(p): p.relative_to(SRC.parent) for p in (SRC / "hfexport").rglob("*.py")}


def test_the_graph_is_read():
    assert len(GRAPH) > 100
    assert any(target == "hfexport.errors" for _, target, _ in GRAPH["hfexport.runner"])


def _upward(graph: dict[str, list[tuple[int, str, str]]]) -> list[str]:
    return sorted({
        f"{FILES.get(module, module)}:{line}: `{text}` (layer {_layer(module)} imports {target}, layer "
        f"{_layer(target)})"
        for module, edges in graph.items()
        for line, target, text in edges
        if _layer(target) > _layer(module) and not module == "hfexport"  # the package's __init__ re-exports
    })


def _circles(graph: dict[str, list[tuple[int, str, str]]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for _, target, _ in graph.get(node, []):
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

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_the_checks_find_what_they_look_for():
    """A made-up upward import and a made-up circle are reported (so a green run means none exists)."""
    graph = {"hfexport.errors": [(3, "hfexport.cli", "from .cli import main")],
             "hfexport.cli": [(5, "hfexport.errors", "from .errors import HfExportError")]}
    assert _upward(graph) == [
        "src/hfexport/errors.py:3: `from .cli import main` (layer 0 imports hfexport.cli, layer 6)"]
    assert _circles(graph) == [["hfexport.cli", "hfexport.errors"]]


def test_no_import_goes_up_a_layer():
    upward = _upward(GRAPH)
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_no_import_circle():
    circles = _circles(GRAPH)
    described = []
    for circle in circles:
        edges = [f"  {FILES[m]}:{line}: `{text}`" for m in circle for line, t, text in GRAPH[m] if t in circle]
        described.append(" <-> ".join(circle) + "\n" + "\n".join(edges))
    assert not circles, "import circles:\n" + "\n".join(described)


@pytest.mark.parametrize("prefix", sorted(LAYERS))
def test_every_layer_prefix_names_modules(prefix):
    assert any(m == prefix or m.startswith(prefix) for m in GRAPH), f"{prefix} names no module: stale entry"
