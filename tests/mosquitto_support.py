"""A real Mosquitto (Debian's ``mosquitto``, installed by scripts/system-deps.sh) on a free
loopback port with a temporary persistence dir, started by a test and stopped by its PID: the
remote broker of the rules' MQTT bridge target. Optionally with a password file (anonymous
clients refused) and a second listener, TLS on a certificate made for the test (``tls_port``)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .ports import free_port

BINARY = "/usr/sbin/mosquitto"


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) for CN 127.0.0.1 with that IP as its subject alternative name (openssl)."""
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return cert, key


class Mosquitto:
    """``start()``, ``stop()`` (SIGTERM: Mosquitto writes its persistence file, as a service
    stop does) and ``kill()`` (SIGKILL); ``start()`` again listens on the same port."""

    def __init__(self, directory: Path, *, users: dict[str, str] | None = None, tls: bool = False) -> None:
        binary = BINARY if Path(BINARY).exists() else shutil.which("mosquitto")
        if binary is None:
            pytest.fail("mosquitto is not installed: the MQTT bridge tests need it; run scripts/system-deps.sh as root "
                        "(apt-get install mosquitto)")
        self.binary = binary
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.certificate: Path | None = None
        self.tls_port = free_port() if tls else 0
        lines = [f"listener {self.port} 127.0.0.1", "persistence true", f"persistence_location {directory}/",
                 "autosave_on_changes true", "autosave_interval 1",  # (each change saved: a kill keeps the sessions)
                 "user root", "log_dest none"]
        if users:
            passwords = directory / "passwords"
            passwords.write_text("")
            for name, password in users.items():
                subprocess.run(["mosquitto_passwd", "-b", str(passwords), name, password], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        else:
            lines += ["allow_anonymous true"]
        if tls:
            self.certificate, key = self_signed_certificate(directory)
            lines += [f"listener {self.tls_port} 127.0.0.1", f"certfile {self.certificate}", f"keyfile {key}"]
        self.config = directory / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([self.binary, "-c", str(self.config)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise AssertionError(f"mosquitto exited with {self.process.returncode}: "
                                         f"{self.process.stderr.read().decode()}") from None  # type: ignore[union-attr]
                time.sleep(0.05)
        raise AssertionError("mosquitto did not start listening")

    def _signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


@pytest.fixture
def mosquitto(tmp_path: Path):
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    yield broker
    broker.stop()
