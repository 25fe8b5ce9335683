"""Which build of the message path runs: the C extensions Cython compiled from the modules that
``pyproject.toml`` lists under ``[tool.tidemq] compiled``, or the same files interpreted.

The compiled modules are plain Python files (Cython's pure-Python mode); the build puts each
one's extension beside it, and Python's import prefers an extension to a source file. This
module, installed by ``gateway/__init__.py`` before anything else of the project is imported,
routes the imports of the project's packages so that:

- ``TIDEMQ_PURE_PYTHON=1`` selects the interpreted build: extensions are ignored, every module
  runs from its ``.py`` (the reference the compiled build is tested against);
- otherwise an extension older than its source is refused with an error that says how to
  rebuild, so an edited module never runs as its stale compiled copy.

A process that imports ``store`` or ``protocols`` without ``gateway`` first (the Spark source's
workers, the store benchmark) gets Python's own rule: the extension where one was built.
"""

from __future__ import annotations

import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
    SourcelessFileLoader,
)
from types import ModuleType
from typing import Sequence

PURE_PYTHON_ENV = "TIDEMQ_PURE_PYTHON"
# The top-level packages whose submodules this routes (those that may hold compiled modules).
PACKAGES = frozenset({"protocols", "store", "cache", "gateway"})
REBUILD_HINT = "rebuild with `bash scripts/venv.sh` or `.venv/bin/python -m pip install -e .`"


class StaleExtensionError(ImportError):
    """A compiled module is older than the source it was compiled from."""


def pure_python_selected() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def is_compiled(module: ModuleType) -> bool:
    return any((getattr(module, "__file__", None) or "").endswith(suffix) for suffix in EXTENSION_SUFFIXES)


def compiled_modules() -> list[str]:
    """Names of the project's modules loaded so far from a compiled extension."""
    return sorted(name for name, module in list(sys.modules.items())
                  if name.partition(".")[0] in PACKAGES and module is not None and is_compiled(module))


class _FreshExtensionLoader(ExtensionFileLoader):
    """Loads an extension only if its source has not changed since it was compiled."""

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        built = os.stat(self.path).st_mtime
        for source in _sources_of(self.path):
            if os.stat(source).st_mtime > built:
                raise StaleExtensionError(f"{spec.name}: {self.path} is older than {source}; {REBUILD_HINT}",
                                          name=spec.name)
        return super().create_module(spec)


def _sources_of(extension: str) -> list[str]:
    """What an extension was compiled from: its ``.py``, and the ``.pxd`` declarations of its
    folder (a module may cimport any of them; checking them all errs on the safe side)."""
    source = extension[: -len(_extension_suffix(extension))] + ".py"
    folder = os.path.dirname(extension)
    found = [source] if os.path.exists(source) else []
    return found + [os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".pxd")]


def _extension_suffix(path: str) -> str:
    return max((s for s in EXTENSION_SUFFIXES if path.endswith(s)), key=len)


class _ProjectFinder(MetaPathFinder):
    """Finds the project's submodules with a FileFinder of its own loaders, per folder."""

    def __init__(self, pure: bool) -> None:
        self.pure = pure
        self._loaders: list[tuple[type, list[str]]] = [(SourceFileLoader, SOURCE_SUFFIXES),
                                                       (SourcelessFileLoader, BYTECODE_SUFFIXES)]
        if not pure:
            self._loaders.insert(0, (_FreshExtensionLoader, EXTENSION_SUFFIXES))
        self._finders: dict[str, FileFinder] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if path is None or fullname.partition(".")[0] not in PACKAGES:
            return None  # top-level names and other projects: Python's own finders
        for entry in path:
            finder = self._finders.get(entry)
            if finder is None:
                finder = self._finders[entry] = FileFinder(entry, *self._loaders)
            spec = finder.find_spec(fullname, target)
            if spec is not None:
                return spec
        return None

    def invalidate_caches(self) -> None:
        for finder in self._finders.values():
            finder.invalidate_caches()


def install() -> None:
    """Route the project's imports (once per process). With the interpreted build selected, a
    compiled module imported before this is an error: the process would run a mix."""
    if any(isinstance(finder, _ProjectFinder) for finder in sys.meta_path):
        return
    pure = pure_python_selected()
    if pure and (mixed := compiled_modules()):
        raise ImportError(f"{PURE_PYTHON_ENV} is set but {', '.join(mixed)} were imported compiled before "
                          "gateway.native.install(): import gateway first")
    sys.meta_path.insert(0, _ProjectFinder(pure))
