"""scripts/venv.sh, which serve.sh and test.sh source: pip runs on a fresh clone and when
pyproject.toml, setup.py or a compiled module's source changes, not on every start (a complete .venv works offline)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from .native_support import COMPILED, ROOT

# stands in for python3 and .venv/bin/python: "-m venv" makes the venv, "-m pip" is logged and,
# for an install of the project (-e), "builds" the compiled modules' extensions (empty files)
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
if [ "$1 $2" = "-m pip" ]; then
    echo "pip $*" >> "$PIP_LOG"
    [ -z "$PIP_FAILS" ] || exit 1
    case " $* " in
        *" -e "*) for source in $BUILT_SOURCES; do touch "${source%.py}.cpython-311-x86_64-linux-gnu.so"; done ;;
    esac
    exit 0
fi
exec python3 "$@"
"""


BUILT_SOURCES = " ".join(name.replace(".", "/") + ".py" for name in COMPILED)


def fake_checkout(checkout: Path, scripts: tuple[str, ...] = ("venv.sh",)) -> None:
    """A checkout with ``scripts``, the project files venv.sh reads, and a fake python that
    logs what pip is asked to do (FAKE_PYTHON)."""
    (checkout / "scripts").mkdir()
    for name in scripts:
        shutil.copy(ROOT / "scripts" / name, checkout / "scripts" / name)
    copy_project_files(checkout)
    fake = checkout / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)


def copy_project_files(checkout: Path) -> None:
    """What venv.sh reads: pyproject.toml, setup.py and the compiled modules' sources."""
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    shutil.copy(ROOT / "setup.py", checkout / "setup.py")
    for name in COMPILED:
        source = Path(name.replace(".", "/") + ".py")
        (checkout / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / source, checkout / source)
        for declarations in (ROOT / source.parent).glob("*.pxd"):
            shutil.copy(declarations, checkout / source.parent / declarations.name)


def run_venv(checkout: Path, extras: str = "", pip_fails: bool = False) -> subprocess.CompletedProcess[str]:
    (checkout / "pip.log").unlink(missing_ok=True)
    env = dict(os.environ, PYTHON=str(checkout / "fake-python"), PIP_LOG=str(checkout / "pip.log"),
               VENV_EXTRAS=extras, PIP_FAILS="1" if pip_fails else "", BUILT_SOURCES=BUILT_SOURCES)
    return subprocess.run(["bash", "-c", "set -euo pipefail; . scripts/venv.sh"], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=60)


def source_venv(checkout: Path, extras: str = "", pip_fails: bool = False) -> tuple[int, list[str]]:
    proc = run_venv(checkout, extras, pip_fails)
    log = checkout / "pip.log"
    return proc.returncode, log.read_text().splitlines() if log.exists() else []


def test_the_install_script_says_when_a_compiled_module_is_built_again(tmp_path: Path) -> None:
    fake_checkout(tmp_path)
    first = run_venv(tmp_path, "test")  # a fresh clone: an install, nothing to say
    assert first.returncode == 0 and "building again" not in first.stderr
    with (tmp_path / (COMPILED[0].replace(".", "/") + ".py")).open("a") as fh:
        fh.write("\n# edited\n")
    rebuilt = run_venv(tmp_path, "test")
    assert rebuilt.returncode == 0
    assert "a compiled module's source changed since the build; building again" in rebuilt.stderr


def test_pip_runs_only_when_the_venv_is_new_or_pyproject_changed(tmp_path: Path) -> None:
    fake_checkout(tmp_path)

    code, pip = source_venv(tmp_path, "test")  # a fresh clone (CI): everything is installed
    assert code == 0 and any('-e .[test]' in line for line in pip), pip
    assert source_venv(tmp_path, "test") == (0, [])  # the next start: no pip
    assert source_venv(tmp_path) == (0, [])  # serve.sh (no extras) after test.sh: the base is there
    with (tmp_path / "pyproject.toml").open("a") as fh:
        fh.write("\n# a dependency changed\n")
    code, pip = source_venv(tmp_path)
    assert code == 0 and any(line.endswith("-e .") for line in pip), pip
    assert source_venv(tmp_path) == (0, [])
    code, pip = source_venv(tmp_path, "test")  # the test extra was installed from the old pyproject
    assert code == 0 and any('-e .[test]' in line for line in pip), pip
    with (tmp_path / "pyproject.toml").open("a") as fh:
        fh.write("\n# and again\n")
    code, _ = source_venv(tmp_path, "test", pip_fails=True)  # a failed install is tried again next time
    assert code != 0
    code, pip = source_venv(tmp_path, "test")
    assert code == 0 and any('-e .[test]' in line for line in pip), pip
    assert source_venv(tmp_path, "test") == (0, [])
    # an edited compiled module: the install builds its extension again
    with (tmp_path / (COMPILED[0].replace(".", "/") + ".py")).open("a") as fh:
        fh.write("\n# edited\n")
    code, pip = source_venv(tmp_path, "test")
    assert code == 0 and any('-e .[test]' in line for line in pip), pip
    with next((tmp_path / "store/log").glob("*.pxd")).open("a") as fh:  # a declaration file a module cimports
        fh.write("\n# edited\n")
    code, pip = source_venv(tmp_path, "test")
    assert code == 0 and any('-e .[test]' in line for line in pip), pip
    # the builds removed (git clean), the sources not: the install builds them again
    assert source_venv(tmp_path, "test") == (0, [])
    next((tmp_path / "store/log").glob("*.so")).unlink()
    code, pip = source_venv(tmp_path, "test")
    assert code == 0 and any('-e .[test]' in line for line in pip), pip
    assert source_venv(tmp_path, "test") == (0, [])


def test_serve_turns_the_loopback_metrics_listener_on_unless_told(tmp_path: Path) -> None:
    fake_checkout(tmp_path, ("venv.sh", "serve.sh"))
    assert source_venv(tmp_path)[0] == 0  # an installed venv
    (tmp_path / "pip.log").unlink()
    tidemq = tmp_path / ".venv" / "bin" / "tidemq"  # says what it was started with
    tidemq.write_text('#!/usr/bin/env bash\necho "args=$* metrics=${TIDEMQ_METRICS_BIND-unset}"\n')
    tidemq.chmod(0o755)

    def serve(*args: str, **env: str) -> str:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
        environ.update(env, PYTHON=str(tmp_path / "fake-python"), PIP_LOG=str(tmp_path / "pip.log"))
        return subprocess.run(["bash", "scripts/serve.sh", *args], cwd=tmp_path, env=environ, check=True,
                              capture_output=True, text=True, timeout=60).stdout.strip()

    assert serve() == "args=serve metrics=localhost:9100"
    assert serve("--data-dir", "d") == "args=serve --data-dir d metrics=localhost:9100"
    assert serve("--metrics-bind", "") == "args=serve --metrics-bind  metrics=unset"
    assert serve("--config", "x.toml") == "args=serve --config x.toml metrics=unset"
    assert serve(TIDEMQ_METRICS_BIND="") == "args=serve metrics="
    assert serve(TIDEMQ_CONFIG="x.toml") == "args=serve metrics=unset"
    assert not (tmp_path / "pip.log").exists()  # and no pip on these starts


def test_an_extension_older_than_its_source_is_built_again_though_the_content_is_the_same(tmp_path: Path) -> None:
    """A checkout that puts a source's content back leaves the hash as it was and the extension
    older than the source, which the test set-up refuses naming venv.sh: venv.sh must build it."""
    fake_checkout(tmp_path)
    code, pip = source_venv(tmp_path, "test")
    assert code == 0 and any('-e .[test]' in line for line in pip), pip
    assert source_venv(tmp_path, "test") == (0, [])
    source = tmp_path / (COMPILED[0].replace(".", "/") + ".py")
    extension = next(source.parent.glob(source.stem + ".*.so"))
    built = extension.stat().st_mtime
    os.utime(source, (built + 60, built + 60))  # same content, touched after the build
    code, pip = source_venv(tmp_path, "test")
    assert code == 0 and any('-e .[test]' in line for line in pip), pip
    os.utime(source, (built - 60, built - 60))  # the build (the fake's touch) is newer again
    assert source_venv(tmp_path, "test") == (0, [])
    assert source_venv(tmp_path) == (0, [])  # serve.sh afterwards: nothing to do


def test_the_venv_can_rebuild_in_place_as_the_test_set_up_says(tmp_path: Path) -> None:
    """The rebuild hint's `.venv/bin/python setup.py build_ext --inplace` needs the build-system's
    setuptools in the venv: the one a venv starts with refuses pyproject.toml's license field."""
    from setuptools.config.pyprojecttoml import read_configuration

    assert read_configuration(ROOT / "pyproject.toml")["project"]["name"] == "tidemq"
    fake_checkout(tmp_path)
    code, pip = source_venv(tmp_path)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert code == 0 and any(line.split()[-len(requires):] == requires for line in pip), pip


def test_the_local_group_installs_what_a_changed_pyproject_asks_before_it_starts(tmp_path: Path) -> None:
    """scripts/local-group.sh on a checkout whose venv predates a new dependency: it must
    install it, as serve.sh does, instead of starting nodes that cannot import it."""
    fake_checkout(tmp_path, ("venv.sh", "local-group.sh"))
    assert source_venv(tmp_path)[0] == 0  # an installed venv
    with (tmp_path / "pyproject.toml").open("a") as fh:
        fh.write("\n# a dependency added\n")
    (tmp_path / "pip.log").unlink(missing_ok=True)
    bin_dir = tmp_path / "bin"  # an etcd that starts nothing
    bin_dir.mkdir()
    (bin_dir / "etcd").write_text("#!/usr/bin/env bash\nexit 0\n")
    (bin_dir / "etcd").chmod(0o755)
    (tmp_path / ".venv" / "bin" / "python").write_text(  # the nodes: each says it started
        FAKE_PYTHON.replace('exec python3 "$@"', '[ "$1 $2" != "-m gateway" ] || { echo "$*" >> "$NODES_LOG"; exit 0; }\n'
                                                 'exec python3 "$@"'))
    env = dict(os.environ, PYTHON=str(tmp_path / "fake-python"), PIP_LOG=str(tmp_path / "pip.log"), BUILT_SOURCES=BUILT_SOURCES,
               NODES_LOG=str(tmp_path / "nodes.log"), PATH=f"{bin_dir}:{os.environ['PATH']}")
    subprocess.run(["bash", "scripts/local-group.sh", str(tmp_path / "group")], cwd=tmp_path, env=env, check=True,
                   capture_output=True, text=True, timeout=60)
    pip = (tmp_path / "pip.log").read_text().splitlines() if (tmp_path / "pip.log").exists() else []
    assert any(line.endswith("-e .") for line in pip), pip
    nodes = (tmp_path / "nodes.log").read_text().splitlines()
    assert len(nodes) == 4  # three store nodes, a gateway node
    binds = [address for line in nodes for address in re.findall(r"--[a-z-]+-bind (\S+)", line)]
    assert len(binds) == len(set(binds)), binds  # a leader's listeners must not meet the gateway node's
