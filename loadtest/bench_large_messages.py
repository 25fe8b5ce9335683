"""Large messages through a gateway process: N messages of each size published at QoS 1 over MQTT
(paho, one publisher, one subscriber) and with confirms over AMQP (pika, then consumed), with
the rate, the bytes per second and the gateway's peak RSS during each run. What the size
defaults (``mqtt_max_packet_size``, ``max_message_size``) are chosen from; not a test.

    python -m loadtest.bench_large_messages [--sizes-mib 1,4,16,64] [--bytes-per-size-mib 256]
                                            [--protocols mqtt,amqp] [--flush async|sync]
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import pika
import psutil
from paho.mqtt.enums import CallbackAPIVersion

from loadtest import runner
from loadtest.brokers import free_port

HOST = "127.0.0.1"
MIB = 1 << 20


class PeakRss:
    """The highest RSS of a process between ``reset()`` and ``peak()`` (sampled every 20 ms)."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self._peak = max(self._peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def reset(self) -> int:
        self._peak = now = self.proc.memory_info().rss
        return now

    def peak(self) -> int:
        return self._peak

    def stop(self) -> None:
        self._stop.set()


def start_gateway(workdir: Path, mqtt_port: int, amqp_port: int, max_size: int, flush: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TIDEMQ_MAX_MESSAGE_SIZE=str(max_size), TIDEMQ_MQTT_MAX_PACKET_SIZE=str(max_size))
    log = (workdir / "gateway.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--data-dir", str(workdir / "data"), "--flush", flush,
         "--mqtt-bind", f"{HOST}:{mqtt_port}", "--amqp-bind", f"{HOST}:{amqp_port}", "--remoting-bind", ""],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    for port in (mqtt_port, amqp_port):
        while True:
            try:
                socket.create_connection((HOST, port), 1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the gateway did not start: {(workdir / 'gateway.log').read_text()[-2000:]}")
                time.sleep(0.1)
    return proc


def run_mqtt(port: int, size: int, count: int) -> float:
    """Seconds from the first publish to the subscriber's last message."""
    received: queue.Queue[int] = queue.Queue()
    subscribed = threading.Event()
    sub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"big-sub-{size}", protocol=paho.MQTTv5)
    sub.on_message = lambda c, u, m: received.put(len(m.payload))
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.connect(HOST, port)
    sub.loop_start()
    sub.subscribe("big/#", 1)
    assert subscribed.wait(10)
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"big-pub-{size}", protocol=paho.MQTTv5)
    pub.connect(HOST, port)
    pub.loop_start()
    payload = os.urandom(size)
    started = time.perf_counter()
    infos = [pub.publish("big/x", payload, 1) for _ in range(count)]
    for _ in range(count):
        assert received.get(timeout=300) == size
    elapsed = time.perf_counter() - started
    assert all(info.is_published() for info in infos)
    for client in (pub, sub):
        client.disconnect()
        client.loop_stop()
    return elapsed


def run_amqp(port: int, size: int, count: int) -> float:
    """Seconds from the first publish (confirms on) to the last message consumed."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(HOST, port, blocked_connection_timeout=300))
    ch = conn.channel()
    ch.confirm_delivery()
    name = f"big-{size}"
    ch.queue_declare(name, durable=True)
    body = os.urandom(size)
    started = time.perf_counter()
    for _ in range(count):
        ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
    got = 0
    for method, _, received in ch.consume(name, inactivity_timeout=300):
        assert method is not None and len(received) == size
        ch.basic_ack(method.delivery_tag)
        got += 1
        if got == count:
            break
    elapsed = time.perf_counter() - started
    ch.cancel()
    conn.close()
    return elapsed


def main() -> None:
    parser = runner.parser(__doc__, out=False, whole_doc=True)
    parser.add_argument("--sizes-mib", default="1,4,16,64")
    parser.add_argument("--bytes-per-size-mib", type=int, default=256, help="messages per size: this many MiB of them (at least 4)")
    parser.add_argument("--protocols", default="mqtt,amqp")
    parser.add_argument("--flush", default="async", choices=("async", "sync"))
    args = parser.parse_args()
    sizes = [int(s) * MIB for s in args.sizes_mib.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-bench-large-"))
    mqtt_port, amqp_port = free_port(), free_port()
    # the largest size plus room for a record's topic, properties and queue list
    proc = start_gateway(workdir, mqtt_port, amqp_port, max(sizes) + MIB, args.flush)
    rss = PeakRss(proc.pid)
    print(f"flush={args.flush} gateway pid={proc.pid} rss_idle_mib={rss.reset() / MIB:.0f}")
    print(f"{'protocol':8} {'size':>8} {'count':>5} {'msgs/s':>8} {'MB/s':>7} {'rss_before':>10} {'rss_peak':>9}")
    try:
        for protocol in args.protocols.split(","):
            run = run_mqtt if protocol == "mqtt" else run_amqp
            port = mqtt_port if protocol == "mqtt" else amqp_port
            for size in sizes:
                count = max(4, args.bytes_per_size_mib * MIB // size)
                before = rss.reset()
                elapsed = run(port, size, count)
                print(f"{protocol:8} {size // MIB:>5}MiB {count:>5} {count / elapsed:>8.1f} "
                      f"{count * size / elapsed / 1e6:>7.1f} {before / MIB:>7.0f}MiB {rss.peak() / MIB:>6.0f}MiB",
                      flush=True)
    finally:
        rss.stop()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
