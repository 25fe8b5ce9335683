"""Import circles between the packages of gateway/ that only ``if TYPE_CHECKING:`` keeps from
failing at run time: a lower package that names a higher one for its types should say what it
needs as a small Protocol at that seam instead (gateway/ports.py, the put target). Inside one
package (one protocol's connection, channel and broker) the modules name one another's classes,
which mypy checks. import-linter (pyproject.toml) checks the layers between top-level packages;
this checks those inside gateway/, which no contract covers. The circles still to remove are
listed: the list may shrink, never grow."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parent.parent / "gateway"

# (importer, imported only for types), in different packages of gateway/: none left
STILL_TO_REMOVE: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(GATEWAY.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """The gateway modules ``path`` imports at run time, and those it imports for types only."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())

    def target(node: ast.ImportFrom) -> set[str]:
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        found = {module} if module in known else set()
        return found | {f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in known}

    typing_only: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom):
                    typing_only |= target(inner)
    run_time: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            run_time |= target(node)
    return run_time, typing_only


def typing_circles() -> set[tuple[str, str]]:
    paths = {module_name(p): p for p in GATEWAY.rglob("*.py")}
    known = set(paths)
    edges = {name: imports(path, known) for name, path in paths.items()}
    graph = {name: run | types for name, (run, types) in edges.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            here = stack.pop()
            if here == goal:
                return True
            if here not in seen:
                seen.add(here)
                stack.extend(graph[here])
        return False

    return {(name, other) for name, (_, types) in edges.items() for other in types
            if package_of(name) != package_of(other) and reaches(other, name)}


def package_of(module: str) -> str:
    return module.rsplit(".", 1)[0]


def test_no_new_typing_only_import_circles() -> None:
    circles = typing_circles()
    assert circles <= STILL_TO_REMOVE, f"new circles: {sorted(circles - STILL_TO_REMOVE)}"


def test_the_list_of_circles_still_to_remove_is_current() -> None:
    gone = STILL_TO_REMOVE - typing_circles()
    assert not gone, f"remove these from STILL_TO_REMOVE, they are gone: {sorted(gone)}"
