"""MQTT soak: a constant load for a bounded time, watching the gateway for leaks.

    python -m loadtest.bench_mqtt --soak-minutes 10 [--soak-rate 2000]
    python -m loadtest.scenarios.soak_mqtt --minutes 10 [--rate 2000]        (the same)

A fresh TideMQ (persistence on, metrics listener on) gets ``rate`` QoS 1 PUBLISHes per second
from 4 publishers (topics soak/0..3, 64-byte payloads) and one subscriber of ``soak/+`` that
acknowledges every delivery. Every 5 s one line reports the gateway's resident memory (and its
anonymous part: the commitlog pages the gateway maps and reads count in RSS but are file-backed
page cache), open file descriptors, event-loop lag (its ``tidemq_event_loop_lag_seconds``) and
the message counts:

    soak t_s=... rss_mib=... anon_mib=... memtable_mib=... fds=... loop_lag_ms=... published=... acked=... received=...

The leak check looks at the anonymous memory less RocksDB's write buffers (``memtable_mib``,
its ``tidemq_store_memtable_bytes``: they fill up to their configured size and are flushed,
a sawtooth of tens of MiB). At the end the peak of that in the last third of the run is
compared with the middle third's (the first is warm-up): the run FAILS (exit status 1) when it rose by more than
``--max-growth-mib-per-min`` (default 1) and by more than 8 MiB in all -- a leak under a
constant load -- or when acknowledged messages were not received.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from loadtest import runner
from loadtest.brokers import Broker, free_port, launch
from protocols.mqtt.codec import PacketReader, encode
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    Connect,
    PingReq,
    PubAck,
    Publish,
    Subscribe,
    Subscription,
)

HOST = "127.0.0.1"
PUBLISHERS = 4
SAMPLE_S = 5.0
PAYLOAD = bytes(64)


def start_gateway() -> tuple[Broker, int]:
    port, metrics_port = free_port(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-soak-"))
    command = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(workdir / "data"),
               "--mqtt-bind", f"{HOST}:{port}", "--amqp-bind", "", "--remoting-bind", "",
               "--metrics-bind", f"{HOST}:{metrics_port}", "--flush", "async"]
    return launch("tidemq", port, command, workdir, workdir / "console.log", dict(os.environ)), metrics_port


PING_S = 20.0  # a subscriber that sends nothing else PINGs within keep-alive (60 s)


class Counts:
    published = 0
    acked = 0
    received = 0


async def client(port: int, client_id: str, subscribe: str | None = None, qos: int = 1):
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(encode(Connect(client_id=client_id, keep_alive=60, clean_start=True), MQTT_3_1_1))
    if subscribe:
        writer.write(encode(Subscribe(1, [Subscription(subscribe, qos=qos)]), MQTT_3_1_1))
    await writer.drain()
    return reader, writer


async def subscriber(port: int, client_id: str, topic_filter: str, qos: int, counts, stop: asyncio.Event) -> None:
    """Read every delivery of ``topic_filter`` (``counts.received``), acknowledge the QoS 1 ones,
    and PING while nothing else is sent (a QoS 0 subscriber sends nothing else; keep-alive 60 s)."""
    reader, writer = await client(port, client_id, topic_filter, qos)
    packets = PacketReader(version=MQTT_3_1_1)
    pinged = time.monotonic()
    while not stop.is_set():
        if time.monotonic() - pinged > PING_S:
            writer.write(encode(PingReq(), MQTT_3_1_1))
            pinged = time.monotonic()
        try:
            data = await asyncio.wait_for(reader.read(1 << 16), 1.0)
        except TimeoutError:
            continue
        if not data:
            raise ConnectionError(f"the gateway closed {client_id}")
        packets.feed(data)
        acks = []
        for packet in packets.packets():
            if isinstance(packet, Publish):
                counts.received += 1
                if packet.qos:
                    acks.append(encode(PubAck(packet.packet_id), MQTT_3_1_1))
        if acks:
            writer.write(b"".join(acks))
    writer.close()


async def publisher(index: int, port: int, rate: float, counts: Counts, stop: asyncio.Event) -> None:
    reader, writer = await client(port, f"soak-pub-{index}")
    packets = PacketReader(version=MQTT_3_1_1)
    topic = f"soak/{index}"

    async def read_acks() -> None:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            packets.feed(data)
            counts.acked += sum(isinstance(p, PubAck) for p in packets.packets())

    acks = asyncio.get_running_loop().create_task(read_acks())
    packet_id = 0
    started = time.monotonic()
    sent = 0
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate) - sent  # paced: the same rate all along
        frames = []
        for _ in range(max(0, due)):
            packet_id = packet_id % 65535 + 1
            frames.append(encode(Publish(topic, PAYLOAD, qos=1, packet_id=packet_id), MQTT_3_1_1))
        if frames:
            writer.write(b"".join(frames))
            sent += len(frames)
            counts.published += len(frames)
            await writer.drain()
        await asyncio.sleep(0.01)
    await asyncio.sleep(1.0)  # the last PUBACKs
    acks.cancel()
    writer.close()


def anon_mib(pid: int) -> float:
    """The process's anonymous memory (RssAnon): its heap, not the commitlog pages it maps and
    reads, which count in RSS but are file-backed and given back under pressure."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def gauges(metrics_port: int, *names: str) -> list[float]:
    """Gauges of the gateway's /metrics (NaN when missing or unreachable)."""
    found = dict.fromkeys(names, float("nan"))
    try:
        with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name in found:
                    found[name] = float(value)
    except OSError:
        pass
    return [found[n] for n in names]


def peak_growth(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(MiB, MiB per minute) by which the peak of the last third of the run exceeds the peak of
    the middle third; the first third is warm-up. Peaks, not a fitted line: the store's write
    buffer fills and is flushed again and again (a sawtooth), which is not a leak."""
    if len(points) < 3:
        return 0.0, 0.0
    end = points[-1][0]
    middle = [m for t, m in points if end / 3 <= t < 2 * end / 3]
    last = [m for t, m in points if t >= 2 * end / 3]
    if not middle or not last:
        return 0.0, 0.0
    grown = max(last) - max(middle)
    return grown, grown / (end / 3 / 60)


async def soak(minutes: float, rate: float, max_growth: float) -> int:
    broker, metrics_port = start_gateway()
    proc = psutil.Process(broker.pid)
    counts = Counts()
    stop = asyncio.Event()
    samples: list[tuple[float, float]] = []
    try:
        tasks = [asyncio.create_task(subscriber(broker.port, "soak-sub", "soak/+", 1, counts, stop))]
        await asyncio.sleep(0.5)  # subscribed
        tasks += [asyncio.create_task(publisher(i, broker.port, rate / PUBLISHERS, counts, stop))
                  for i in range(PUBLISHERS)]
        started = time.monotonic()
        end = started + minutes * 60
        while time.monotonic() < end:
            await asyncio.sleep(min(SAMPLE_S, max(0.0, end - time.monotonic())))
            for task in tasks:
                if task.done() and task.exception():
                    raise task.exception()  # type: ignore[misc]
            elapsed = time.monotonic() - started
            rss = proc.memory_info().rss / 2**20
            anon = anon_mib(broker.pid)
            lag_s, memtables = await asyncio.to_thread(gauges, metrics_port, "tidemq_event_loop_lag_seconds",
                                                       "tidemq_store_memtable_bytes")
            memtable_mib = memtables / 2**20
            samples.append((elapsed, anon - memtable_mib))
            print(f"soak t_s={elapsed:.0f} rss_mib={rss:.1f} anon_mib={anon:.1f} memtable_mib={memtable_mib:.1f} "
                  f"fds={proc.num_fds()} loop_lag_ms={lag_s * 1000:.1f} "
                  f"published={counts.published} acked={counts.acked} received={counts.received}", flush=True)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(2.0)  # deliveries still on their way
    finally:
        broker.stop()
    grown, growth = peak_growth(samples)
    lost = counts.acked - counts.received
    problems = []
    if growth > max_growth and grown > 8:
        problems.append(f"memory grew steadily: its peak rose {grown:.1f} MiB ({growth:.2f} MiB/min) "
                        "from the middle to the last third of the run")
    if lost > 0:
        problems.append(f"{lost} acknowledged messages not received")
    verdict = "FAIL" if problems else "PASS"
    print(f'soak result={verdict} minutes={minutes:g} rate={rate:g} heap_peak_growth_mib={grown:.1f} '
          f'published={counts.published} acked={counts.acked} received={counts.received}'
          + (f' reason="{"; ".join(problems)}"' if problems else ""), flush=True)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = runner.parser(__doc__, out=False)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2000.0, help="QoS 1 publishes per second, in all")
    parser.add_argument("--max-growth-mib-per-min", type=float, default=1.0)
    args = parser.parse_args(argv)
    return asyncio.run(soak(args.minutes, args.rate, args.max_growth_mib_per_min))


if __name__ == "__main__":
    sys.exit(main())
