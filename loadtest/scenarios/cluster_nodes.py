"""The processes of a benchmark cluster on 127.0.0.1: one ``--role store`` node and N ``--role
gateway`` nodes (``python -m gateway serve``), each with its own temp dir, console log and
metrics listener; started together, stopped by PID (gateway nodes first), their warnings
collected and their metrics scraped. Used by bench_cluster."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from loadtest.brokers import ROOT, Broker, BrokerUnavailable, free_port
from loadtest.clients.mqtt_wire import HOST

NODE_START_S = 60.0  # 9 Python processes starting at once on 2 cores take a while
COMPLAINT_MARKERS = ("level=warning", "level=error", "level=critical", "Traceback")


# -- the cluster -----------------------------------------------------------------------------------
@dataclass(slots=True)
class Node:
    process: Broker  # port: the remoting port (store node) or the MQTT port (gateway node)
    metrics_port: int
    log_offset: int = 0  # where this case's part of the console log starts

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return self.process.port


@dataclass(slots=True)
class Cluster:
    store: Node
    gateways: list[Node]

    @property
    def nodes(self) -> list[Node]:
        return [self.store, *self.gateways]


def spawn(name: str, args: list[str], port: int, env_extra: dict[str, str]) -> Node:
    """Start one node (its own temp dir for data and console log); does not wait for it."""
    workdir = Path(tempfile.mkdtemp(prefix=f"tidemq-bench-cluster-{name}-"))
    metrics_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    env.update(env_extra)
    command = [sys.executable, "-m", "gateway", "serve", *args, "--data-dir", str(workdir / "data"),
               "--metrics-bind", f"{HOST}:{metrics_port}"]
    log_path = workdir / "console.log"
    with open(log_path, "wb") as console:
        proc = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, env=env)
    return Node(Broker(name, port, proc, workdir, log_path), metrics_port)


def wait_ready(nodes: list[Node], timeout_s: float = NODE_START_S) -> None:
    """Until every node logged "gateway ready"; a node that exits or stays silent fails the case."""
    deadline = time.monotonic() + timeout_s
    waiting = list(nodes)
    while waiting:
        for node in list(waiting):
            if node.process.proc.poll() is not None:
                raise BrokerUnavailable(f"node {node.name} exited with status {node.process.proc.returncode}: "
                                        f"{node.process.log_tail()}")
            try:
                if "gateway ready" in node.process.log_path.read_text(errors="replace"):
                    waiting.remove(node)
            except OSError:
                pass
        if waiting and time.monotonic() > deadline:
            raise BrokerUnavailable(f"node(s) {','.join(n.name for n in waiting)} not ready within {timeout_s:g} s: "
                                    f"{waiting[0].process.log_tail()}")
        if waiting:
            time.sleep(0.1)


def start_cluster(gateways: int, routing: str = "targeted", cache: bool = True) -> Cluster:
    store_port = free_port()
    store = spawn("store", ["--role", "store", "--remoting-bind", f"{HOST}:{store_port}", "--amqp-bind", "",
                            "--flush", "async"], store_port, {"TIDEMQ_NOTIFY_ROUTING": routing})
    cluster = Cluster(store, [])
    try:
        wait_ready([store])
        gateway_env = {} if cache else {"TIDEMQ_QUEUE_CACHE_BYTES": "0"}
        for i in range(gateways):
            port = free_port()
            cluster.gateways.append(spawn(f"g{i}", ["--role", "gateway", "--node-id", f"g{i}", "--store",
                                                    f"{HOST}:{store_port}", "--mqtt-bind", f"{HOST}:{port}"],
                                          port, gateway_env))
        wait_ready(cluster.gateways)  # started together: each imports the project in parallel
    except BaseException:
        stop_cluster(cluster)
        raise
    for node in cluster.nodes:
        node.log_offset = node.process.log_path.stat().st_size
    return cluster


def stop_cluster(cluster: Cluster, keep_logs: Path | None = None, label: str = "") -> None:
    """Gateway nodes first (SIGTERM, then SIGKILL after 10 s), then the store node; each by PID."""
    for node in cluster.gateways:  # together: each takes a moment to close its connections
        if node.process.proc.poll() is None:
            node.process.proc.send_signal(signal.SIGTERM)
    if keep_logs is not None:
        keep_logs.mkdir(parents=True, exist_ok=True)
    for node in [*cluster.gateways, cluster.store]:
        if node is cluster.store and node.process.proc.poll() is None:
            node.process.proc.send_signal(signal.SIGTERM)
        process = node.process
        try:
            process.proc.wait(10)
        except subprocess.TimeoutExpired:
            process.proc.kill()
            try:
                process.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass  # unkillable for now: its temp dir goes anyway
        if keep_logs is not None:
            try:
                shutil.copyfile(process.log_path, keep_logs / f"{label}-{node.name}.log")
            except OSError:
                pass
        shutil.rmtree(process.workdir, ignore_errors=True)


def complaints(cluster: Cluster) -> list[str]:
    """Warning and error lines (and tracebacks) the nodes logged since the case started."""
    found = []
    for node in cluster.nodes:
        try:
            with open(node.process.log_path, "rb") as log:
                log.seek(node.log_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            continue
        found += [f"{node.name}: {line.strip()}" for line in text.splitlines()
                  if any(marker in line for marker in COMPLAINT_MARKERS)]
    return found


# -- metrics ---------------------------------------------------------------------------------------
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(node: Node) -> Samples:
    with urllib.request.urlopen(f"http://{HOST}:{node.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)
