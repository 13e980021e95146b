"""The package's shape, read from its imports: the rules ARCHITECTURE.md states, checked so that they hold.

Imports are the runtime ones (module level and inside functions); those under ``if TYPE_CHECKING:``
are annotations only and do not count.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
from helpers import REPO

PACKAGE = REPO / "audiobuffer"

#: Each part of the package and its layer: a module imports only from its own layer or those below.
#: The facade (``__init__``, ``__main__``) stands above them all and imports lazily.
LAYERS = {
    "errors": 0, "_checks": 0,
    "buffer": 1, "options": 1, "_numpy_collate": 1,
    "sources": 2,
    "decoders": 3,
    "collate": 4, "features": 4, "normalize": 4, "jpeg": 4, "prepare": 4, "augment": 4, "probe": 4,
    "engine": 5,
    "loaders": 6, "ray": 6,
    "config": 7,
    "cli": 8,
}
MAX_LEVELS = 10
MAX_MODULES_PER_FOLDER = 15
MAX_LINES = 700


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports at run time."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    here = name.split(".") if name else []
    found: set[str] = set()

    def target(node: ast.ImportFrom) -> str | None:
        if node.level == 0:
            if not (node.module or "").startswith("audiobuffer"):
                return None
            return (node.module or "").removeprefix("audiobuffer").lstrip(".")
        base = here if is_package else here[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.ImportFrom):
                module = target(child)
                if module is not None:
                    subs = [f"{module}.{a.name}".lstrip(".") for a in child.names
                            if f"{module}.{a.name}".lstrip(".") in modules]
                    if len(subs) < len(child.names) and module in modules:
                        found.add(module)
                    found.update(subs)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("audiobuffer."):
                        module = alias.name.removeprefix("audiobuffer.")
                        while module and module not in modules:
                            module = module.rpartition(".")[0]
                        if module:
                            found.add(module)
            visit(child)

    visit(tree)
    found.discard(name)
    found.discard("")  # the facade: importing it costs nothing (PEP 562)
    return found


MODULES = _modules()
GRAPH = {name: _imports(name, path, MODULES) for name, path in MODULES.items() if name not in ("", "__main__")}


def layer(name: str) -> int:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"audiobuffer.{name} belongs to no layer of LAYERS: add it there and to ARCHITECTURE.md")


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                strong(w)
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
                found.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            strong(v)
    return found


def test_no_import_circles():
    assert _circles() == []


def test_imports_point_down_the_layers():
    upward = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
              for a, targets in GRAPH.items() for b in targets if layer(b) > layer(a)]
    assert upward == []


def test_the_import_chain_is_at_most_ten_levels():
    depth: dict[str, int] = {}

    def level(name: str, seen: tuple[str, ...] = ()) -> int:
        if name not in depth:
            assert name not in seen, f"import circle through {name}"
            depth[name] = 1 + max((level(t, seen + (name,)) for t in GRAPH.get(name, ())), default=0)
        return depth[name]

    deepest = max(GRAPH, key=level)
    assert level(deepest) <= MAX_LEVELS, f"audiobuffer.{deepest} sits {level(deepest)} levels deep"


def test_folders_and_modules_stay_small_enough_to_read():
    per_folder = Counter(path.parent for path in MODULES.values())
    crowded = {str(folder.relative_to(REPO)): n for folder, n in per_folder.items() if n > MAX_MODULES_PER_FOLDER}
    assert crowded == {}
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("module", ["loaders.isolated.helper", "engine.pool", "engine.epoch", "sources.source"])
def test_the_helpers_side_never_imports_torch(module):
    # The helper process runs without torch: nothing it imports may import torch at module level.
    todo, seen = [module], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" for a in n.names)
                       or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch"
                       for n in top), f"audiobuffer.{name} imports torch (reached from audiobuffer.{module})"
        todo.extend(GRAPH.get(name, ()))


def test_only_the_ray_bridge_imports_ray():
    # ray is an optional extra: the rest of the package runs without it, and never imports it
    def imports_ray(path: Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] == "ray" for name in names):
                return True
        return False

    assert sorted(name for name, path in MODULES.items() if imports_ray(path)) == ["ray"]
    assert not any("ray" in imported for imported in GRAPH.values())  # nor audiobuffer.ray


def test_every_note_the_code_points_to_is_written_once():
    # NOTE [ Name ] blocks hold the protocols; code elsewhere points to them by name.
    import re

    written: Counter[str] = Counter()
    cited: set[str] = set()
    for path in MODULES.values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            for name in re.findall(r"NOTE \[ ([^\]]+?) \]", line):
                heading = n + 1 < len(lines) and re.fullmatch(r"\s*#?\s*=+", lines[n + 1]) is not None
                (written.update if heading else cited.add)([name] if heading else name)
    assert sorted(name for name, n in written.items() if n > 1) == []
    assert sorted(cited - set(written)) == []
