"""Run at start-up by every Python process the tests start (``tests/builds.py`` puts this folder
on their PYTHONPATH): with ``TIDEMQ_PURE_PYTHON=1``, the process runs the interpreted build."""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "tidemq_test_builds", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "builds.py"))
assert _spec is not None and _spec.loader is not None
_builds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_builds)
if _builds.pure_python_selected():
    _builds.select_interpreted()
