"""The compiled message path: the modules below are plain Python (Cython's pure-Python mode) and
are also compiled to C extensions by Cython when the package is built (``pip install``,
``pip install -e .``, or ``python setup.py build_ext --inplace`` in a checkout).

One source of truth: each ``.py`` file here is what Cython compiles and what the tests also run
interpreted (``TIDEMQ_PURE_PYTHON=1``, see ``tests/builds.py``); its ``import cython`` annotations give C
types to the compiled build and are no-ops interpreted. A failed compilation fails the build:
a machine that cannot compile must not silently run the slow path.

``TIDEMQ_BUILD_PURE=1`` asks for the other wheel on purpose: pure Python (``py3-none-any``),
nothing compiled, the one to send with a Spark job (``--py-files``: Python imports no compiled
extension from a zip). See docs/spark.md, "Shipping the source with a job".
"""

import os
import tomllib
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
# Dotted names of the compiled modules, listed once, in pyproject.toml ([tool.tidemq] compiled).
COMPILED_MODULES: list[str] = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["tidemq"]["compiled"]

DIRECTIVES = {
    "language_level": 3,
    "binding": True,  # functions keep Python's introspection (signatures, __wrapped__)
    "embedsignature": True,
    "annotation_typing": True,
    # Overflow, bounds and division are checked as Python does: a malformed frame must raise,
    # never read past a buffer. Hot loops opt out locally where they prove their bounds.
    "boundscheck": True,
    "wraparound": True,
    "cdivision": False,
}


PURE_BUILD_ENV = "TIDEMQ_BUILD_PURE"


def extensions() -> list[Extension]:
    if os.environ.get(PURE_BUILD_ENV) == "1":
        return []
    modules = [Extension(name, [name.replace(".", "/") + ".py"]) for name in COMPILED_MODULES]
    # (paths relative to the project: setuptools builds from its folder)
    return cythonize(modules, compiler_directives=DIRECTIVES, build_dir="build/cython", quiet=True)


setup(ext_modules=extensions())
