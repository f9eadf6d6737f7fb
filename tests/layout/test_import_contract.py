"""The dependency direction of the packages, and no import cycles.

    protocol  <-  client, shuffler, analyzer  <-  central, simulation, audit, deploy, learning, studies  <-  cli

A module may import from its own layer and the layers to its left, never to its right,
wherever the import statement is (a function-level import counts: it runs all the same).
Within the parties' layer the device package ``client`` and the ``shuffler`` import only
``protocol``: a device loads no server code, and the shuffler, which must learn nothing
about values, holds no decoder. The ``analyzer`` may import ``client``: its decoders
read what the device's randomizers produce (report ranges, grids, Hadamard rows).
The small root modules ``shuffledp.progress``, ``shuffledp.size_cap`` and ``shuffledp.install`` sit with
``protocol``. Module-level imports (the ones that run when a module is loaded) form no
cycle. ``docs/design.md`` (Layout) states the same rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where each top-level package's sources live (pyproject.toml's package-dir).
SOURCES = {
    "shuffledp": ROOT / "shuffledp",
    "shuffledp.protocol": ROOT / "protocol",
    "shuffledp.client": ROOT / "client",
    "shuffledp.shuffler": ROOT / "shuffler",
    "shuffledp.analyzer": ROOT / "analyzer",
}
LAYERS = [
    ["shuffledp.protocol", "shuffledp.progress", "shuffledp.size_cap", "shuffledp.install", "shuffledp"],
    ["shuffledp.client", "shuffledp.shuffler", "shuffledp.analyzer"],
    ["shuffledp.central", "shuffledp.simulation", "shuffledp.audit", "shuffledp.deploy", "shuffledp.learning",
     "shuffledp.studies"],
    ["shuffledp.cli"],
]
#: Within the parties' layer, what each party may import besides protocol.
PARTY_PEERS = {"shuffledp.client": set(), "shuffledp.shuffler": set(), "shuffledp.analyzer": {"shuffledp.client"}}


def modules() -> dict[str, Path]:
    found = {}
    for package, directory in SOURCES.items():
        for path in directory.rglob("*.py"):
            parts = [p for p in path.relative_to(directory).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = modules()


def owner(module: str) -> str:
    """The package of ``module`` that names its place in the layers (the longest listed prefix)."""
    listed = [name for layer in LAYERS for name in layer]
    return max((n for n in listed if module == n or module.startswith(n + ".")), key=len)


def rank(module: str) -> int:
    name = owner(module)
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def resolve(name: str) -> str | None:
    """The project module an import names (``pkg.mod.attr`` -> ``pkg.mod``), or None if it is not ours."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(path: Path, *, module_level_only: bool) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.If) and module_level_only:
            continue  # `if TYPE_CHECKING:` blocks do not run
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = resolve(f"{node.module}.{alias.name}") or resolve(node.module)
                if target:
                    found.append((target, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(alias.name)
                if target:
                    found.append((target, node.lineno))
    return found


def test_every_module_has_a_place_in_the_layers():
    assert len(MODULES) > 100
    for module in MODULES:
        rank(module)  # raises StopIteration / ValueError if it has none


def test_no_module_imports_from_a_layer_to_its_right():
    wrong = []
    for module, path in sorted(MODULES.items()):
        for target, line in imports(path, module_level_only=False):
            if rank(target) > rank(module):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_parties_import_only_protocol_and_the_analyzer_the_client():
    wrong = []
    for module, path in sorted(MODULES.items()):
        party = owner(module)
        if party not in PARTY_PEERS:
            continue
        for target, line in imports(path, module_level_only=False):
            other = owner(target)
            if rank(target) == 1 and other != party and other not in PARTY_PEERS[party]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_module_level_imports_form_no_cycle():
    graph = {m: {t for t, _ in imports(p, module_level_only=True) if t != m} for m, p in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, cycles


def test_a_planted_upward_import_is_caught(tmp_path):
    """The check can fail: a protocol module importing the CLI is reported."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from shuffledp.cli import main\n")
    assert [t for t, _ in imports(planted, module_level_only=False)] == ["shuffledp.cli"]
    assert rank("shuffledp.cli") > rank("shuffledp.protocol.wire.codec")


def test_the_root_package_keeps_at_most_six_modules():
    root = sorted(p.name for p in (ROOT / "shuffledp").glob("*.py"))
    assert len(root) <= 6, root
