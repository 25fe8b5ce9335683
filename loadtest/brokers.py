"""The brokers the benchmarks measure, each started on a free loopback port and stopped by PID.

bench_mqtt.py (``start_broker``): TideMQ (``python -m gateway serve``, persistence on),
Mosquitto (Debian's package, persistence off), RabbitMQ's MQTT plugin (a private node, as
below) and the amqtt broker (the Python peer, in its own process). bench_amqp.py (``start_amqp_broker``): TideMQ with only its AMQP listener and
``--flush sync``, and a private RabbitMQ node (Debian's package) with its own epmd, config, data
and logs in a temp dir."""

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
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from loadtest.clients.amqp_wire import AMQPClientError, Conn
from loadtest.clients.mqtt_wire import HOST

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
    # the process whose CPU is the broker's when it is not ``proc`` (RabbitMQ: the beam.smp
    # under the start script), and helpers stopped after it (RabbitMQ: its private epmd)
    worker: psutil.Process | None = None
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    version: str = ""

    @property
    def pid(self) -> int:
        return self.worker.pid if self.worker is not None else self.proc.pid

    def log_tail(self, lines: int = 3, complaints_only: bool = False) -> str:
        """The last lines of the broker's log, or of its warnings and errors only."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        if complaints_only:
            text = [line for line in text if "error" in line.lower() or "warn" in line.lower()]
        return " | ".join(line[:300] for line in text[-lines:])

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            return False
        return self.worker is None or self.worker.is_running()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.worker is not None:  # psutil checks it is still the process we found, not a reused PID
            try:
                self.worker.wait(timeout_s)
            except psutil.TimeoutExpired:
                self.worker.kill()
            except psutil.NoSuchProcess:
                pass
        for helper in self.helpers:
            if helper.poll() is None:
                helper.terminate()
                try:
                    helper.wait(5)
                except subprocess.TimeoutExpired:
                    helper.kill()
                    helper.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


TIDEMQ_TRACED = "tidemq+trace"  # TideMQ with message trace on its MQTT listener


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
    elif name == "rabbitmq":
        return start_rabbitmq_mqtt(port, workdir, env)
    elif name in ("tidemq", TIDEMQ_TRACED):
        command = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(workdir / "data"),
                   "--mqtt-bind", f"{HOST}:{port}", "--amqp-bind", "", "--remoting-bind", "", "--flush", "async"]
        if name == TIDEMQ_TRACED:
            command += ["--trace", "mqtt"]
        # its default QoS 0 bound (mqtt_max_queued_messages 1,000), unlike Mosquitto's: a
        # subscriber that keeps reading must get everything on the default configuration
        env.pop("TIDEMQ_MQTT_MAX_QUEUED_MESSAGES", None)
    else:
        raise ValueError(name)
    # The fd limit main() raised is inherited: Mosquitto needs it for 10,000 idle connections.
    return launch(name, port, command, workdir, log_path, env)


def find_beam(broker: Broker) -> None:
    """A RabbitMQ node's beam.smp (the process whose CPU and memory are the broker's), once it runs."""
    if broker.worker is None:
        beams = [p for p in psutil.Process(broker.proc.pid).children(recursive=True) if p.name() == "beam.smp"]
        broker.worker = beams[0] if beams else None


def rabbitmq_booted(broker: Broker) -> Broker:
    """A node that answers: from now on its complaints are in the node's log, not on stdout."""
    if broker.worker is None:
        raise BrokerUnavailable("rabbitmq answers but its beam.smp process was not found")
    broker.log_path = broker.workdir / "log" / "tidemqbench@localhost.log"
    return broker


def start_rabbitmq_mqtt(port: int, workdir: Path, env: dict[str, str]) -> Broker:
    """A private RabbitMQ node with its MQTT plugin on ``port``; returns once that port listens
    (the plugin starts after the node has booted) and the node's beam.smp is known."""
    helpers = [rabbitmq_node(workdir, free_port(), env, mqtt_port=port)]
    log_path = workdir / "console.log"
    with open(log_path, "wb") as console:
        proc = subprocess.Popen([RABBITMQ_SERVER], cwd=workdir, stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, env=env)
    broker = Broker("rabbitmq", port, proc, workdir, log_path, helpers=helpers)
    try:
        deadline = time.monotonic() + RABBITMQ_START_S
        while True:
            if proc.poll() is not None:
                raise BrokerUnavailable(f"rabbitmq exited with status {proc.returncode}: {broker.log_tail()}")
            find_beam(broker)
            try:
                with socket.create_connection((HOST, port), timeout=0.5):
                    pass
            except OSError:
                pass
            else:
                return rabbitmq_booted(broker)
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"rabbitmq's MQTT plugin did not listen on {HOST}:{port} within "
                                        f"{RABBITMQ_START_S:g} s: {broker.log_tail()}")
            time.sleep(0.2)
    except BaseException:
        broker.stop()
        raise


def launch(name: str, port: int, command: list[str], workdir: Path, log_path: Path, env: dict[str, str]) -> Broker:
    """Start ``command`` (its output to ``workdir/console.log``) and wait until ``port`` listens."""
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
    parts.append(f"rabbitmq={rabbitmq_version() or 'missing'}")
    for package, label in (("amqtt", "amqtt"), ("tidemq", "tidemq")):
        try:
            parts.append(f"{label}={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{label}=missing")
    return " ".join(parts)


# -- AMQP brokers (bench_amqp.py) ------------------------------------------------------------------
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # not /usr/sbin's wrapper: it su's to rabbitmq
RABBITMQ_START_S = 90.0  # a node boots in ~8 s here when the machine is idle
AMQP_START_S = 30.0


def rabbitmq_version() -> str | None:
    """The installed rabbitmq-server package's version, or None."""
    if not os.access(RABBITMQ_SERVER, os.X_OK):
        return None
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"], capture_output=True,
                             text=True, check=False, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out or "?"


def epmd_path() -> str | None:
    found = shutil.which("epmd")
    if found:
        return found
    for erts in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"), reverse=True):
        if os.access(erts, os.X_OK):
            return str(erts)
    return None


def rabbitmq_node(workdir: Path, amqp_port: int, env: dict[str, str], mqtt_port: int | None = None) -> subprocess.Popen[bytes]:
    """Prepare a private RabbitMQ node in ``workdir`` (config, ``env``; with the MQTT plugin
    listening on ``mqtt_port`` when given) and start its own epmd, returned: the node is then
    ``RABBITMQ_SERVER`` run with ``env`` in ``workdir``."""
    epmd = epmd_path()
    if rabbitmq_version() is None or epmd is None:
        shutil.rmtree(workdir, ignore_errors=True)
        raise BrokerUnavailable("rabbitmq-server is not installed: run scripts/bench-setup.sh "
                                "(apt-get install -y rabbitmq-server)")
    epmd_port, dist_port = free_port(), free_port()
    conf = (f"listeners.tcp.default = {HOST}:{amqp_port}\n"
            "loopback_users.guest = true\n"
            "log.console = false\n")
    plugins = "[]"  # no management plugin: only the broker
    if mqtt_port is not None:
        # anonymous MQTT clients log in as guest, allowed from loopback
        conf += f"mqtt.listeners.tcp.default = {HOST}:{mqtt_port}\nmqtt.allow_anonymous = true\n"
        plugins = "[rabbitmq_mqtt]"
    (workdir / "rabbitmq.conf").write_text(conf)
    (workdir / "enabled_plugins").write_text(plugins + ".\n")
    env.update({
        "HOME": str(workdir),  # its .erlang.cookie goes here
        "RABBITMQ_NODENAME": "tidemqbench@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": HOST,
        "RABBITMQ_NODE_PORT": str(amqp_port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": HOST,
        "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"),
        "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
        "RABBITMQ_CONF_ENV_FILE": str(workdir / "rabbitmq-env.conf"),  # absent: /etc's is not read
        "RABBITMQ_PID_FILE": str(workdir / "rabbitmq.pid"),
        "RABBITMQ_PLUGINS_EXPAND_DIR": str(workdir / "plugins-expand"),
        # Erlang distribution on loopback only
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    })
    # Our own epmd, a child of ours on a free port, so that the node neither uses nor starts
    # a system-wide one (erl's "epmd -daemon" finds the port taken and leaves).
    with open(workdir / "epmd.log", "wb") as epmd_log:
        return subprocess.Popen([epmd, "-port", str(epmd_port), "-address", HOST], cwd=workdir,
                                stdin=subprocess.DEVNULL, stdout=epmd_log, stderr=subprocess.STDOUT,
                                env=env)


def start_amqp_broker(name: str, module: str = "gateway") -> Broker:
    """TideMQ (AMQP listener only, ``--flush sync``) or a private RabbitMQ node, on a free
    127.0.0.1 port; returns once it completes an AMQP handshake. ``module``: what TideMQ runs
    as (``python -m MODULE serve ...``; loadtest.latency_stages stamps the gateway's stages)."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix=f"tidemq-bench-amqp-{name}-"))
    log_path = workdir / "console.log"
    env = dict(os.environ)
    helpers: list[subprocess.Popen[bytes]] = []
    if name == "tidemq":
        command = [sys.executable, "-m", module, "serve", "--data-dir", str(workdir / "data"),
                   "--mqtt-bind", "", "--amqp-bind", f"{HOST}:{port}", "--remoting-bind", "",
                   "--metrics-bind", "", "--flush", "sync"]
        deadline_s = AMQP_START_S
    elif name == "rabbitmq":
        helpers.append(rabbitmq_node(workdir, port, env))
        command = [RABBITMQ_SERVER]
        deadline_s = RABBITMQ_START_S
    else:
        raise ValueError(name)
    with open(log_path, "wb") as console:
        proc = subprocess.Popen(command, cwd=workdir if name == "rabbitmq" else ROOT, stdin=subprocess.DEVNULL,
                                stdout=console, stderr=subprocess.STDOUT, env=env)
    broker = Broker(name, port, proc, workdir, log_path, helpers=helpers)
    try:
        deadline = time.monotonic() + deadline_s
        last_error = "no answer"
        while True:
            if proc.poll() is not None:
                raise BrokerUnavailable(f"{name} exited with status {proc.returncode}: {broker.log_tail()}")
            if name == "rabbitmq":
                find_beam(broker)
            try:
                conn = Conn(port, 5.0)
            except (OSError, AMQPClientError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                props = conn.server_properties
                conn.close()
                broker.version = " ".join(str(props[k]) for k in ("product", "version", "platform") if props.get(k))
                return rabbitmq_booted(broker) if name == "rabbitmq" else broker
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"{name} completed no AMQP handshake on {HOST}:{port} within "
                                        f"{deadline_s:g} s ({last_error}): {broker.log_tail()}")
            time.sleep(0.2)
    except BaseException:
        broker.stop()
        raise
