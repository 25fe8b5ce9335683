"""A real etcd (Debian's etcd-server, installed by scripts/system-deps.sh) on free loopback
ports with a temporary data dir, started by a test and stopped by its PID."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import aetcd
import pytest

from .ports import free_port


class EtcdServer:
    def __init__(self, data_dir: Path) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            pytest.fail("etcd is not installed: the replication tests need it; run scripts/system-deps.sh as root "
                        "(apt-get install etcd-server)")
        self.binary = binary
        self.data_dir = data_dir
        self.port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.process = subprocess.Popen(
            [self.binary, "--name", "test", "--data-dir", str(self.data_dir), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"test={peer}", "--log-level", "error"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise AssertionError(f"etcd exited with {self.process.returncode}") from None
                time.sleep(0.05)
        raise AssertionError("etcd did not start listening")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    async def leader(self, group: str) -> dict | None:
        """The group's leader record (gateway/cluster/election.py), or None."""
        return await self._get(f"/tidemq/groups/{group}/leader")

    async def state(self, group: str) -> dict | None:
        """The group's state: epoch, leader, in_sync."""
        return await self._get(f"/tidemq/groups/{group}/state")

    async def _get(self, key: str) -> dict | None:
        client = aetcd.Client(host="127.0.0.1", port=self.port, timeout=5)
        try:
            got = await client.get(key.encode())
            return json.loads(got.value) if got is not None else None
        finally:
            await client.close()


@pytest.fixture
def etcd(tmp_path: Path):
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    yield server
    server.stop()
