"""The import graph of src/redrive: no circle, and no module importing a layer above it.

Every `import` and `from ... import` in a module counts, wherever it is written: at
the top, inside a function (imported late for start-up time) or under TYPE_CHECKING
(a dependency all the same). Read from the source with `ast`, nothing is imported.

The layers, lowest first:

- the core (`redrive/*.py`: headers, policy, kafka...): the contract and pure logic;
- `consumer/` and `spark/`: the engines, which may use the core only;
- `service/`: the retry service; its web wing (`service/web/`) sits on top of the
  rest of the service, and only the service's orchestrator (`service/service.py`)
  creates it;
- `local/` (the dev stack), `demo/`, `cli.py` (and `local_commands.py`, its
  `redrive local`): tools on top; production code (core, engines, service) imports
  none of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "redrive"

Graph = dict[str, set[str]]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _imported(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The redrive modules `name` imports: `from a.b import c` names module a.b.c when
    c is a module, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target.split(".")[0] == PACKAGE and target != name:
                yield target


def import_graph() -> Graph:
    modules = _modules()
    known = set(modules)
    return {name: set(_imported(name, path, known)) for name, path in modules.items()}


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in sorted(graph.get(node, ())):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


CORE_ABOVE = ("redrive.consumer", "redrive.spark", "redrive.service", "redrive.local")
TOOLS = ("redrive.local", "redrive.demo", "redrive.cli", "redrive.local_commands")
WEB = "redrive.service.web"
ORCHESTRATOR = "redrive.service.service"


def layer_violations(graph: Graph) -> list[str]:
    """`importer -> imported` for each import of a layer above the importer's."""
    found = []
    for importer, targets in sorted(graph.items()):
        for target in sorted(targets):
            edge = f"{importer} -> {target}"
            core = importer.count(".") == 1 and not _under(
                importer, *CORE_ABOVE, *TOOLS, "redrive.demo"
            )
            if core and _under(target, *CORE_ABOVE, *TOOLS):
                found.append(f"{edge}: the core imports a layer above it")
            elif _under(importer, "redrive.consumer", "redrive.spark") and _under(
                target, "redrive.service", *TOOLS
            ):
                found.append(f"{edge}: an engine imports the service or a tool")
            elif _under(importer, "redrive.service") and _under(target, *TOOLS):
                found.append(f"{edge}: the service imports a tool (the dev stack)")
            elif web_violation(importer, target):
                found.append(f"{edge}: {web_violation(importer, target)}")
    return found


def web_violation(importer: str, target: str) -> str | None:
    """The web wing's rules: it is created only by the orchestrator, and it never
    imports the orchestrator (it is handed the collaborators it needs)."""
    if _under(importer, WEB) and target == ORCHESTRATOR:
        return "the web wing imports the service object"
    if (
        _under(target, WEB)
        and not _under(importer, WEB)
        and importer not in (ORCHESTRATOR, "redrive.cli")
    ):
        return "only the service's orchestrator creates the web wing"
    return None


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "redrive.service.web.app" in graph
    assert "redrive.service.operations" in graph["redrive.service.web.deps"]
    assert ORCHESTRATOR in graph["redrive.cli"]


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_circle_in_src() -> None:
    assert cycles(import_graph()) == []


def test_the_web_wing_keeps_to_its_layer() -> None:
    graph = import_graph()
    found = [
        f"{importer} -> {target}: {web_violation(importer, target)}"
        for importer, targets in sorted(graph.items())
        for target in sorted(targets)
        if web_violation(importer, target)
    ]
    assert found == []


def test_no_module_imports_a_layer_above_it() -> None:
    assert layer_violations(import_graph()) == []
