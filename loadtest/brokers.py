"""The brokers bench_mqtt.py measures, each started on a free loopback port and stopped by PID:
TideMQ (``python -m gateway serve``, persistence on), Mosquitto (Debian's package, persistence
off) and the amqtt broker (the Python peer, in its own process)."""

from __future__ import annotations

import importlib.metadata
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.mqtt_wire import HOST

ROOT = Path(__file__).resolve().parent.parent
MOSQUITTO_QUEUE = 10_000_000
BROKER_START_S = 20.0


class ScenarioError(Exception):
    """A scenario cannot go on: the broker refused or dropped the load, or a worker failed."""


class BrokerUnavailable(ScenarioError):
    """The broker is not installed, did not start listening or opened no MQTT session at all:
    its remaining scenarios are skipped."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def mosquitto_path() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None)


AMQTT_MAIN = """
import asyncio, logging, sys
from amqtt.broker import Broker

async def main(port):
    broker = Broker({
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}", "max_connections": 0}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    })
    await broker.start()
    await asyncio.Event().wait()

logging.basicConfig(level=logging.WARNING)
asyncio.run(main(int(sys.argv[1])))
"""


@dataclass(slots=True)
class Broker:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 3, complaints_only: bool = False) -> str:
        """The last lines of the broker's log, or of its warnings and errors only."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        if complaints_only:
            text = [line for line in text if "error" in line.lower() or "warn" in line.lower()]
        return " | ".join(line[:300] for line in text[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_broker(name: str) -> Broker:
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix=f"tidemq-bench-{name}-"))
    log_path = workdir / "console.log"  # stdout and stderr
    env = dict(os.environ)
    if name == "mosquitto":
        binary = mosquitto_path()
        if binary is None:
            shutil.rmtree(workdir, ignore_errors=True)
            raise BrokerUnavailable("mosquitto is not installed: run scripts/bench-setup.sh "
                                    "(apt-get install -y mosquitto)")
        conf = workdir / "mosquitto.conf"
        log_path = workdir / "mosquitto.log"
        lines = [f"listener {port} {HOST}", "allow_anonymous true", "persistence false",
                 f"max_queued_messages {MOSQUITTO_QUEUE}", f"log_dest file {log_path}"]
        if os.geteuid() == 0:  # else it drops to user mosquitto, who cannot write our private temp dir
            lines.append("user root")
        conf.write_text("\n".join(lines) + "\n")
        command = [binary, "-c", str(conf)]
    elif name == "amqtt":
        try:
            importlib.metadata.version("amqtt")
        except importlib.metadata.PackageNotFoundError:
            shutil.rmtree(workdir, ignore_errors=True)
            raise BrokerUnavailable("amqtt is not installed in this venv: .venv/bin/pip install -e '.[bench]'") from None
        command = [sys.executable, "-c", AMQTT_MAIN, str(port)]
    elif name == "tidemq":
        command = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(workdir / "data"),
                   "--mqtt-bind", f"{HOST}:{port}", "--amqp-bind", "", "--remoting-bind", "", "--flush", "async"]
        # the same QoS 0 queue bound Mosquitto gets (its max_queued_messages)
        env["TIDEMQ_MQTT_MAX_QUEUED_MESSAGES"] = str(MOSQUITTO_QUEUE)
    else:
        raise ValueError(name)
    # The fd limit main() raised is inherited: Mosquitto needs it for 10,000 idle connections.
    with open(workdir / "console.log", "wb") as console:
        proc = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, env=env)
    broker = Broker(name, port, proc, workdir, log_path)
    try:
        wait_listening(broker)
    except BaseException:
        broker.stop()
        raise
    return broker


def wait_listening(broker: Broker) -> None:
    deadline = time.monotonic() + BROKER_START_S
    while time.monotonic() < deadline:
        if broker.proc.poll() is not None:
            raise BrokerUnavailable(f"{broker.name} exited with status {broker.proc.returncode}: {broker.log_tail()}")
        try:
            with socket.create_connection((HOST, broker.port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BrokerUnavailable(f"{broker.name} did not listen on {HOST}:{broker.port} within {BROKER_START_S:g} s")


def broker_versions() -> str:
    parts = []
    binary = mosquitto_path()
    if binary:
        first = subprocess.run([binary, "-h"], capture_output=True, text=True, check=False, timeout=10).stdout
        parts.append(f"mosquitto={first.split()[2] if first.startswith('mosquitto version') else '?'}")
    else:
        parts.append("mosquitto=missing")
    for package, label in (("amqtt", "amqtt"), ("tidemq", "tidemq")):
        try:
            parts.append(f"{label}={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{label}=missing")
    return " ".join(parts)
