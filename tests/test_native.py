"""The build of the compiled message path: every module pyproject.toml lists is compiled unless
``TIDEMQ_PURE_PYTHON=1`` selects the interpreted build; a stale extension is refused; a process
cannot run a mix of the two."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gateway.native import PURE_PYTHON_ENV, compiled_modules, is_compiled, pure_python_selected

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


def run(code: str, *, pure: bool, path: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
    if pure:
        env[PURE_PYTHON_ENV] = "1"
    return subprocess.run([sys.executable, "-c", code], cwd=path, env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_environment_variable_selects_the_build_in_a_gateway_process() -> None:
    code = ("import gateway, protocols.mqtt.reader as r; from gateway.native import is_compiled; "
            "print(is_compiled(r))")
    assert run(code, pure=False).stdout.strip() == "True"
    assert run(code, pure=True).stdout.strip() == "False"


def test_a_compiled_module_imported_before_the_selection_is_refused() -> None:
    result = run("import protocols.mqtt.reader, gateway", pure=True)
    assert result.returncode != 0
    assert f"{PURE_PYTHON_ENV} is set but protocols.mqtt.reader" in result.stderr


def test_an_extension_older_than_its_source_is_refused(tmp_path: Path) -> None:
    """A copy of the checkout's packages whose reader source was edited after the build."""
    for package in ("gateway", "protocols"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    source = tmp_path / "protocols/mqtt/reader.py"
    extension = next(p for p in source.parent.iterdir() if p.name.startswith("reader.") and p.suffix == ".so")
    os.utime(extension, (source.stat().st_mtime - 10, source.stat().st_mtime - 10))
    result = run("import gateway, protocols.mqtt.reader", pure=False, path=tmp_path)
    assert result.returncode != 0
    assert "StaleExtensionError" in result.stderr and "is older than" in result.stderr
    # the interpreted build does not look at extensions at all
    assert run("import gateway, protocols.mqtt.reader", pure=True, path=tmp_path).returncode == 0


def test_an_extension_older_than_a_declaration_file_of_its_folder_is_refused(tmp_path: Path) -> None:
    """store/log/record.py cimports store/log/zlib_crc.pxd: an edited .pxd makes the extension stale too."""
    for package in ("gateway", "store"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    log = tmp_path / "store/log"
    extension = next(p for p in log.iterdir() if p.name.startswith("record.") and p.suffix == ".so")
    declarations = next(log.glob("*.pxd"))
    assert run("import gateway, store.log.record", pure=False, path=tmp_path).returncode == 0
    os.utime(declarations, (extension.stat().st_mtime + 10, extension.stat().st_mtime + 10))
    result = run("import gateway, store.log.record", pure=False, path=tmp_path)
    assert result.returncode != 0 and f"is older than {declarations}" in result.stderr


def test_a_gateway_serves_with_the_selector_set_either_way(tmp_path: Path) -> None:
    """TIDEMQ_PURE_PYTHON is a TIDEMQ_* name but no setting: set empty (the compiled build) or to
    1, the configuration does not refuse it as unknown."""
    for value in ("", "1"):
        proc = launch(["--data-dir", str(tmp_path / f"data{value}"), "--mqtt-bind", f"127.0.0.1:{free_port()}",
                       "--amqp-bind", "", "--remoting-bind", ""], env={PURE_PYTHON_ENV: value})
        stop(proc)
        assert proc.returncode == 0
