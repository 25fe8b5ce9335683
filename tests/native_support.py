"""Both builds of a compiled module in one process, for the differential tests: the C extension
Cython built from it, and the same ``.py`` interpreted (the reference).

Whichever build the process selected (``TIDEMQ_PURE_PYTHON``, tests/builds.py) is the one in
``sys.modules``; the other is loaded beside it here, so the differential tests compare the two
in either mode of the suite.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import strategies as st

from .builds import ROOT, is_compiled, listed_modules

COMPILED: list[str] = listed_modules()
_INTERPRETED_ALIAS = "__interpreted"


def _source(name: str) -> Path:
    return ROOT / (name.replace(".", "/") + ".py")


def compiled(name: str) -> ModuleType:
    """The C extension of module ``name``; an error (a failed test) where none was built."""
    module = importlib.import_module(name)
    if is_compiled(module):
        return module
    # this process runs interpreted: load the extension under its own name, outside sys.modules
    # (its PyInit_ symbol is named after the module, so it cannot be loaded under an alias)
    path = next((p for s in EXTENSION_SUFFIXES if (p := _source(name).with_suffix(s)).exists()), None)
    if path is None:
        raise AssertionError(f"{name} has no compiled extension beside {_source(name)}: the build did not run")
    loader = ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    extension = loader.create_module(spec)
    loader.exec_module(extension)
    return extension


def interpreted(name: str) -> ModuleType:
    """Module ``name`` run from its ``.py`` (its siblings are whatever build the process has)."""
    module = importlib.import_module(name)
    if not is_compiled(module):
        return module
    alias = name + _INTERPRETED_ALIAS
    if alias in sys.modules:
        return sys.modules[alias]
    spec = importlib.util.spec_from_file_location(alias, _source(name))
    assert spec is not None and spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    reference.__package__ = name.rpartition(".")[0]  # its relative imports resolve as the real module's
    sys.modules[alias] = reference  # (dataclasses look their module up while the body runs)
    spec.loader.exec_module(reference)
    return reference


def outcome(call: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """What a call gives: its value, or its error's type and message (the builds share their
    error classes), so that two builds' answers compare with ==."""
    try:
        return "value", call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return "error", (type(exc), str(exc))


def damage(data: st.DataObject, blob: bytes) -> bytes:
    """``blob`` with one to four bytes changed, inserted or removed, drawn from ``data``."""
    wire = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(wire)))
        action = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if action == "set" and at < len(wire):
            wire[at] = data.draw(st.integers(0, 255))
        elif action == "insert":
            wire[at:at] = bytes([data.draw(st.integers(0, 255))])
        elif at < len(wire):
            del wire[at]
    return bytes(wire)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the points ``cuts`` name (modulo its length): the chunks it arrives in."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]
