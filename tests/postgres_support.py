"""A real PostgreSQL (Debian's ``postgresql``, installed by scripts/system-deps.sh) on a free
loopback port: ``initdb`` into a temporary dir and the ``postgres`` server started by a test and
stopped by its PID. PostgreSQL refuses to run as root: as root, both run as the ``postgres``
user the package creates."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import asyncpg
import pytest

from .mosquitto_support import free_port


def _binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        pytest.fail("PostgreSQL is not installed: the PostgreSQL target tests need it; run scripts/system-deps.sh "
                    "as root (apt-get install postgresql)")
    return Path(found[-1]).parent


class Postgres:
    """``start()``, ``stop()`` (a fast shutdown, SIGINT) and ``start()`` again on the same port
    and data; ``dsn`` for asyncpg (database ``postgres``, user ``tidemq``, trust auth)."""

    def __init__(self) -> None:
        self.bin = _binaries()
        self.user = "postgres" if os.geteuid() == 0 else None
        # (not under pytest's tmp_path: mode 0700 and root's, which the postgres user cannot enter)
        self.directory = Path(tempfile.mkdtemp(prefix="tidemq-pg-"))
        self.data = self.directory / "data"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "tidemq", "-A", "trust", "-E", "UTF8",
                        "--no-sync"], check=True, user=self.user, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)

    @property
    def dsn(self) -> str:
        return f"postgresql://tidemq@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.directory),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
            user=self.user, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"])
            if ready.returncode == 0:
                return
            if self.process.poll() is not None:
                raise AssertionError(f"postgres exited with {self.process.returncode}")
            time.sleep(0.1)
        raise AssertionError("postgres did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    async def query(self, sql: str, *args: object) -> list[asyncpg.Record]:
        connection = await asyncpg.connect(self.dsn)
        try:
            return await connection.fetch(sql, *args)
        finally:
            await connection.close()

    async def execute(self, sql: str) -> None:
        connection = await asyncpg.connect(self.dsn)
        try:
            await connection.execute(sql)
        finally:
            await connection.close()


@pytest.fixture
def postgres():
    server = Postgres()
    server.start()
    yield server
    server.remove()
