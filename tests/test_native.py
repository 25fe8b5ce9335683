"""The build of the compiled message path: every module pyproject.toml lists is compiled unless
``TIDEMQ_PURE_PYTHON=1`` selects the interpreted build (tests/builds.py, in the test set-up only);
a stale extension is found; a process cannot run a mix of the two; the gateway itself has no
import hook."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .builds import (
    PURE_PYTHON_ENV,
    compiled_modules,
    is_compiled,
    pure_python_selected,
    stale_extensions,
    with_site,
)
from .crash_support import free_port, launch, stop
from .native_support import COMPILED, ROOT, compiled


def test_the_listed_modules_run_compiled_unless_the_interpreted_build_is_selected() -> None:
    """In the suite's compiled run this fails if the build produced no extension (CI builds from
    a clean clone); in its interpreted run, if an extension slipped in."""
    assert COMPILED, "pyproject.toml lists no compiled module"
    for name in COMPILED:
        module = importlib.import_module(name)
        assert is_compiled(module) is not pure_python_selected(), (name, module.__file__)
    assert (set(COMPILED) <= set(compiled_modules())) is not pure_python_selected()


def test_every_listed_module_has_a_built_extension() -> None:
    for name in COMPILED:
        assert is_compiled(compiled(name)), name


def run(code: str, *, pure: bool, site: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (PURE_PYTHON_ENV, "PYTHONPATH")}
    if pure:
        env[PURE_PYTHON_ENV] = "1"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=with_site(env) if site else env,
                          capture_output=True, text=True, timeout=60)


def test_the_environment_variable_selects_the_build_of_a_process_the_tests_start() -> None:
    code = "import protocols.mqtt.reader as r; print(r.__file__.endswith('.py'))"
    assert run(code, pure=False).stdout.strip() == "False"
    assert run(code, pure=True).stdout.strip() == "True"


def test_a_gateway_process_runs_the_installed_build_with_no_import_hook() -> None:
    """Outside the test set-up the variable chooses nothing: the gateway imports what the install
    built, and adds no finder to Python's import system."""
    code = ("import sys; before = list(sys.meta_path); import gateway.server, protocols.mqtt.reader as r; "
            "print(r.__file__.endswith('.py'), sys.meta_path == before)")
    assert run(code, pure=True, site=False).stdout.split() == ["False", "True"]


def test_a_compiled_module_imported_before_the_selection_is_refused() -> None:
    code = ("import protocols.mqtt.reader, runpy, os; os.environ['TIDEMQ_PURE_PYTHON'] = '1'; "
            "runpy.run_path('tests/site/sitecustomize.py')")
    result = run(code, pure=False, site=False)
    assert result.returncode != 0
    assert f"{PURE_PYTHON_ENV} is set but protocols.mqtt.reader" in result.stderr


def copy_of(packages: tuple[str, ...], to: Path) -> Path:
    """A checkout of ``packages`` (their built extensions included) and pyproject.toml."""
    for package in packages:
        shutil.copytree(ROOT / package, to / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", to / "pyproject.toml")
    return to


def test_an_extension_older_than_its_source_is_found(tmp_path: Path) -> None:
    """A copy of the checkout whose reader source was edited after the build."""
    root = copy_of(("gateway", "protocols", "store"), tmp_path)
    assert stale_extensions(root) == []
    source = root / "protocols/mqtt/reader.py"
    extension = next(p for p in source.parent.iterdir() if p.name.startswith("reader.") and p.suffix == ".so")
    os.utime(extension, (source.stat().st_mtime - 10, source.stat().st_mtime - 10))
    assert stale_extensions(root) == [f"protocols.mqtt.reader: {extension} is older than {source}"]


def test_an_extension_older_than_a_declaration_file_of_its_folder_is_found(tmp_path: Path) -> None:
    """store/log/record.py cimports store/log/zlib_crc.pxd: an edited .pxd makes the extension stale too."""
    root = copy_of(("gateway", "protocols", "store"), tmp_path)
    log = root / "store/log"
    extension = next(p for p in log.iterdir() if p.name.startswith("record.") and p.suffix == ".so")
    declarations = next(log.glob("*.pxd"))
    os.utime(declarations, (extension.stat().st_mtime + 10, extension.stat().st_mtime + 10))
    assert f"store.log.record: {extension} is older than {declarations}" in stale_extensions(root)


def test_the_test_set_up_stops_on_a_stale_extension(tmp_path: Path) -> None:
    """pytest run in a copy of the checkout whose reader is older than its source stops at once,
    saying which extension and how to rebuild."""
    root = copy_of(("gateway", "protocols", "store", "cache", "lookup"), tmp_path)
    (root / "tests").mkdir()
    for name in ("__init__.py", "conftest.py", "builds.py"):
        shutil.copy2(ROOT / "tests" / name, root / "tests" / name)
    shutil.copytree(ROOT / "tests/site", root / "tests/site")
    (root / "tests/test_nothing.py").write_text("def test_nothing():\n    pass\n")
    source = root / "protocols/mqtt/reader.py"
    source.touch()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=root,
                            capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 3, result.stdout + result.stderr
    assert "stale compiled extensions (protocols.mqtt.reader:" in result.stdout + result.stderr
    assert "scripts/venv.sh" in result.stdout + result.stderr


def test_a_gateway_serves_with_the_selector_set_either_way(tmp_path: Path) -> None:
    """TIDEMQ_PURE_PYTHON is a TIDEMQ_* name but no setting: set empty (the compiled build) or to
    1, the configuration does not refuse it as unknown."""
    for value in ("", "1"):
        proc = launch(["--data-dir", str(tmp_path / f"data{value}"), "--mqtt-bind", f"127.0.0.1:{free_port()}",
                       "--amqp-bind", "", "--remoting-bind", ""], env={PURE_PYTHON_ENV: value})
        stop(proc)
        assert proc.returncode == 0
