"""Shared fixtures: a real store in a temporary data dir, opened and closed per test."""

from __future__ import annotations

import os
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
