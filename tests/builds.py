"""Which build of the compiled message path a test (or benchmark) process runs.

The install builds each module ``pyproject.toml`` lists under ``[tool.tidemq] compiled`` into a C
extension beside its ``.py``, and Python's import prefers the extension: that is the build the
gateway runs. The suite's interpreted pass (``TIDEMQ_PURE_PYTHON=1``) calls
``select_interpreted`` before the project is imported, so every module runs from its ``.py``;
``tests/site/sitecustomize.py`` does the same in each process the tests start. ``stale_extensions``
is the test set-up's check that no extension is older than the source it was built from.

Standard library only: ``tests/site/sitecustomize.py`` loads this file before anything else.
"""

from __future__ import annotations

import os
import sys
import tomllib
from importlib.abc import MetaPathFinder
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
    SourcelessFileLoader,
)
from pathlib import Path
from types import ModuleType
from typing import Sequence

PURE_PYTHON_ENV = "TIDEMQ_PURE_PYTHON"
ROOT = Path(__file__).resolve().parent.parent
# the folder whose sitecustomize.py selects the build in the processes the tests start
SITE_DIR = Path(__file__).resolve().parent / "site"
# The top-level packages that may hold compiled modules.
PACKAGES = frozenset({"protocols", "store", "cache", "gateway"})
REBUILD_HINT = "rebuild with `bash scripts/venv.sh` or `.venv/bin/python setup.py build_ext --inplace`"


def pure_python_selected() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def is_compiled(module: ModuleType) -> bool:
    return any((getattr(module, "__file__", None) or "").endswith(suffix) for suffix in EXTENSION_SUFFIXES)


def compiled_modules() -> list[str]:
    """Names of the project's modules loaded so far from a compiled extension."""
    return sorted(name for name, module in list(sys.modules.items())
                  if name.partition(".")[0] in PACKAGES and module is not None and is_compiled(module))


def listed_modules(root: Path = ROOT) -> list[str]:
    """The modules pyproject.toml lists as compiled."""
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["tidemq"]["compiled"]


def stale_extensions(root: Path = ROOT) -> list[str]:
    """One line per built extension older than what it was compiled from: its ``.py``, or a
    ``.pxd`` declaration file of its folder (a module may cimport any of them)."""
    found = []
    for name in listed_modules(root):
        source = root / (name.replace(".", "/") + ".py")
        for extension in source.parent.glob(source.stem + ".*"):
            if not any(extension.name.endswith(suffix) for suffix in EXTENSION_SUFFIXES):
                continue
            built = extension.stat().st_mtime
            for newer in [source, *sorted(source.parent.glob("*.pxd"))]:
                if newer.stat().st_mtime > built:
                    found.append(f"{name}: {extension} is older than {newer}")
    return found


class _SourceFinder(MetaPathFinder):
    """Finds the project's submodules from their ``.py`` (or bytecode), never an extension."""

    def __init__(self) -> None:
        self._finders: dict[str, FileFinder] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if path is None or fullname.partition(".")[0] not in PACKAGES:
            return None  # top-level names and other projects: Python's own finders
        for entry in path:
            finder = self._finders.get(entry)
            if finder is None:
                finder = self._finders[entry] = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES),
                                                           (SourcelessFileLoader, BYTECODE_SUFFIXES))
            spec = finder.find_spec(fullname, target)
            if spec is not None:
                return spec
        return None

    def invalidate_caches(self) -> None:
        for finder in self._finders.values():
            finder.invalidate_caches()


def select_interpreted() -> None:
    """From now on, this process imports the project's modules from their ``.py`` files (once
    per process). A compiled module imported before is an error: the process would run a mix."""
    if any(type(finder).__name__ == _SourceFinder.__name__ for finder in sys.meta_path):
        return
    if mixed := compiled_modules():
        raise ImportError(f"{PURE_PYTHON_ENV} is set but {', '.join(mixed)} were imported compiled before "
                          "the interpreted build was selected")
    sys.meta_path.insert(0, _SourceFinder())


def select_from_environment() -> None:
    """The build ``TIDEMQ_PURE_PYTHON`` selects, for this process: call before the project is imported."""
    if pure_python_selected():
        select_interpreted()


def with_site(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process, with ``tests/site`` first on its PYTHONPATH: the child runs the
    build ``TIDEMQ_PURE_PYTHON`` in its environment selects."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE_DIR)]
    return {**env, "PYTHONPATH": os.pathsep.join([str(SITE_DIR), *paths])}
