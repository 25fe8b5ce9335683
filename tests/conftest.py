"""Shared fixtures: a real store in a temporary data dir, opened and closed per test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from .builds import REBUILD_HINT, pure_python_selected, select_interpreted, stale_extensions, with_site

# Before the project is imported: the build this run tests (tests/builds.py), in this process and,
# through tests/site/sitecustomize.py, in every process the tests start.
if pure_python_selected():
    select_interpreted()
os.environ.update(with_site(dict(os.environ)))

from store import MessageStore, StoreOptions  # noqa: E402

# Property tests check behaviour, not speed: no per-example deadline (a loaded 2-core CI
# machine once took 376 ms for an example, and speed is measured by the benchmarks instead).
settings.register_profile("tidemq", deadline=None)
settings.load_profile("tidemq")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config: pytest.Config) -> None:
    """A stale extension stops the run: the tests would judge the code an edit replaced."""
    if stale := stale_extensions():
        pytest.exit("stale compiled extensions (" + "; ".join(stale) + f"): {REBUILD_HINT}", returncode=3)


@pytest.fixture(autouse=True)
def stop_launched_gateways():
    """After each test, stop the gateway processes it launched (tests/crash_support.py) and left
    running: a test that fails half-way through starting a group must not leave its nodes behind.
    (Those a module's fixture launched before the test are that fixture's to stop.)"""
    from .crash_support import LAUNCHED, stop

    before = len(LAUNCHED)
    yield
    while len(LAUNCHED) > before:
        stop(LAUNCHED.pop())


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def open_store(data_dir: Path):
    """Open stores on ``data_dir`` (options may override); every one still open is closed at the end."""
    opened: list[MessageStore] = []

    async def _open(**options) -> MessageStore:
        options.setdefault("data_dir", data_dir)
        store = await MessageStore.open(StoreOptions(**options))
        opened.append(store)
        return store

    yield _open
    for store in opened:
        await store.close()


@pytest.fixture(scope="session")
def rocketmq_home(tmp_path_factory: pytest.TempPathFactory):
    """librocketmq (the C++ RocketMQ client) writes its logs under ~/logs: a temporary HOME."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(tmp_path_factory.mktemp("rocketmq-home")))
        yield


@pytest.fixture(scope="session")
def spark():
    """The one Spark session of the run (tests/spark_support.py), started on first use."""
    from tests.spark_support import start_spark

    session = start_spark()
    yield session
    session.stop()


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A CA's certificate and key."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", f"/CN={name}")
    return cert, key


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A test CA, the gateway's certificate (for 127.0.0.1) signed by it and its key, and
    another CA that signed nothing of the gateway's. One for the session (here, for every
    module: grpcio reads the default roots, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, once a process)."""
    tmp_path = tmp_path_factory.mktemp("pki")
    ca, ca_key = make_ca(tmp_path, "test-ca")
    other_ca, _ = make_ca(tmp_path, "other-ca")
    key, request, cert = tmp_path / "server.key", tmp_path / "server.csr", tmp_path / "server.pem"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request), "-subj", "/CN=127.0.0.1")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "2", "-extfile", str(tmp_path / "san.ext"))
    return {"ca": ca, "other_ca": other_ca, "cert": cert, "key": key}
