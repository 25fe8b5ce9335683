"""``tidemq-spark-python``: the Python for Spark's Python processes (``spark.pyspark.python``)
that imports pyspark with its bytecode.

Spark starts every Python process it needs (a stream's source runner and the planner on the
driver's host, the executors' worker daemons) as ``PYTHON -m MODULE`` with
``$SPARK_HOME/python/lib/pyspark.zip`` first on ``PYTHONPATH``. Python compiles a module
imported from a zip archive each time and caches nothing, so each of those processes spends
0.5-0.9 s compiling pyspark before it does any work, and a query's first micro-batch waits for
them one after the other. When that archive is the one inside a pip-installed pyspark (the
package's ``python/lib/pyspark.zip``, ``SPARK_HOME`` being the package) and holds the same
release, this launcher leaves it off the path, so ``import pyspark`` finds the installed copy
and its cached bytecode, then runs ``MODULE`` as ``python -m`` would. Any other archive (a
Spark installation of its own, another release) stays where Spark put it. Anything but
``-m MODULE`` runs the interpreter unchanged.
"""

from __future__ import annotations

import os
import runpy
import sys
import zipfile

ARCHIVE = os.path.join("python", "lib", "pyspark.zip")


def installed_archive(entry: str) -> bool:
    """Whether the path entry ``entry`` is the pyspark.zip inside a pip-installed pyspark
    package that holds the same release (its ``version.py`` the same bytes)."""
    if not entry.endswith(ARCHIVE):
        return False
    package = entry[: -len(ARCHIVE)].rstrip(os.sep)
    if os.path.basename(package) != "pyspark" or not os.path.isfile(os.path.join(package, "__init__.py")):
        return False
    try:
        with open(os.path.join(package, "version.py"), "rb") as f:
            installed = f.read()
        with zipfile.ZipFile(entry) as archive:
            shipped = archive.read("pyspark/version.py")
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    return installed == shipped


def without_installed_archive(path: list[str]) -> list[str]:
    """``path`` (``sys.path``) without the installed pyspark's own archive (``installed_archive``):
    ``import pyspark`` then finds the installed package, further along the path."""
    return [entry for entry in path if not installed_archive(entry)]


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])
    module = args[1]
    # as `python -m` has it: the working directory first, unless PYTHONSAFEPATH says not (this
    # script's own folder, where the interpreter put it, is not a module's)
    if sys.flags.safe_path:
        del sys.path[0]
    else:
        sys.path[0] = os.getcwd()
    sys.path[:] = without_installed_archive(sys.path)
    sys.argv = [module, *args[2:]]  # (run_module puts the module's file in argv[0])
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
