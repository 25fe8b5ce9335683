"""Mixed-protocol soak: a fixed load for N minutes, watching the gateway's memory for a slope.

    python -m loadtest.soak [--minutes 30] [--qos1-rate 1000] [--qos0-rate 500] [--amqp-rate 500]

A fresh TideMQ (persistence on, ``--flush async``, MQTT, AMQP and metrics listeners) gets, at a
fixed rate: MQTT QoS 1 PUBLISHes (2 publishers, topics soak/q1/0..1, one QoS 1 subscriber of
soak/q1/+ that acknowledges every delivery), MQTT QoS 0 PUBLISHes (one publisher, one QoS 0
subscriber of soak/q0/+), and AMQP publishes with publisher confirms to a durable queue that
an AMQP consumer (prefetch 1,000, manual acks) drains; 64-byte bodies. Once a minute one line
gives the gateway's memory from /proc/PID/smaps_rollup (Rss, and Anonymous: its heaps, not the
file-backed commitlog pages it maps), RocksDB's write buffers and block cache, and the queue cache
(``tidemq_store_memtable_bytes``, ``tidemq_store_block_cache_bytes``, ``tidemq_queue_cache_bytes``):

    soak minute=... rss_mb=... anon_mb=... memtable_mb=... block_cache_mb=... queue_cache_mb=... fds=... qos1=... qos0=... amqp=...

(each count is published/received), and at the end:

    soak minutes=30 rss_start_mb=... rss_end_mb=... anon_slope_mb_per_10min=...

The slope is a least-squares line through the anonymous memory of the minutes after the first
5 (warm-up: the queue cache and RocksDB's buffers fill). The run FAILS (exit 1) when the slope
reaches ``--max-slope`` (default 5 MiB per 10 minutes) or a confirmed / acknowledged message
was not received.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aio_pika
import psutil

from loadtest import runner
from loadtest.brokers import Broker, free_port, launch
from loadtest.scenarios.soak_mqtt import client, gauges, subscriber
from protocols.mqtt.codec import PacketReader, encode
from protocols.mqtt.packets import MQTT_3_1_1, PubAck, Publish

HOST = "127.0.0.1"
PAYLOAD = bytes(64)
WARM_UP_MIN = 5
AMQP_QUEUE = "soak-amqp"
TICK_S = 0.02  # publishers send what is due every tick: a steady rate, no bursts


class Flow:
    """Counts of one kind of traffic: sent, confirmed by the gateway (QoS 1 / AMQP), received."""

    def __init__(self) -> None:
        self.sent = self.confirmed = self.received = 0

    def __str__(self) -> str:
        return f"{self.sent}/{self.received}"


def memory_mb(pid: int) -> tuple[float, float]:
    """(Rss, Anonymous) of the process in MiB, from smaps_rollup."""
    found = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            name, _, value = line.partition(":")
            if name in ("Rss", "Anonymous"):
                found[name] = int(value.split()[0]) / 1024
    return found["Rss"], found["Anonymous"]


def slope_per_10min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, MiB) points, in MiB per 10 minutes (0 with < 2 points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return 10 * sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def start_gateway() -> tuple[Broker, int, int]:
    port, amqp_port, metrics_port = free_port(), free_port(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-soak-"))
    command = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(workdir / "data"),
               "--mqtt-bind", f"{HOST}:{port}", "--amqp-bind", f"{HOST}:{amqp_port}", "--remoting-bind", "",
               "--metrics-bind", f"{HOST}:{metrics_port}", "--flush", "async"]
    return launch("tidemq", port, command, workdir, workdir / "console.log", dict(os.environ)), amqp_port, metrics_port


async def paced(rate: float, stop: asyncio.Event, send) -> None:
    """Call ``send(n)`` with what is due at ``rate`` per second, every tick, until ``stop``."""
    started = time.monotonic()
    sent = 0
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate) - sent
        if due > 0:
            await send(due)
            sent += due
        await asyncio.sleep(TICK_S)


async def mqtt_publisher(port: int, client_id: str, topic: str, qos: int, rate: float, flow: Flow,
                         stop: asyncio.Event) -> None:
    reader, writer = await client(port, client_id)
    packets = PacketReader(version=MQTT_3_1_1)
    packet_id = 0

    async def read_acks() -> None:
        while data := await reader.read(1 << 16):
            packets.feed(data)
            flow.confirmed += sum(isinstance(p, PubAck) for p in packets.packets())

    async def send(n: int) -> None:
        nonlocal packet_id
        frames = []
        for _ in range(n):
            packet_id = packet_id % 65535 + 1
            frames.append(encode(Publish(topic, PAYLOAD, qos=qos, packet_id=packet_id if qos else None),
                                 MQTT_3_1_1))
        writer.write(b"".join(frames))
        flow.sent += n
        if not qos:
            flow.confirmed += n
        await writer.drain()

    acks = asyncio.get_running_loop().create_task(read_acks())
    await paced(rate, stop, send)
    await asyncio.sleep(1.0)  # the last PUBACKs
    acks.cancel()
    writer.close()


async def amqp_traffic(port: int, rate: float, flow: Flow, stop: asyncio.Event) -> None:
    """One connection publishing with confirms to a durable queue, one consuming it with acks."""
    url = f"amqp://guest:guest@{HOST}:{port}/"
    producer = await aio_pika.connect(url)
    consumer = await aio_pika.connect(url)
    try:
        pub_channel = await producer.channel(publisher_confirms=True)
        await pub_channel.declare_queue(AMQP_QUEUE, durable=True)
        sub_channel = await consumer.channel()
        await sub_channel.set_qos(prefetch_count=1000)
        queue = await sub_channel.declare_queue(AMQP_QUEUE, durable=True)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            flow.received += 1
            await message.ack()

        await queue.consume(on_message)
        exchange = pub_channel.default_exchange

        async def send(n: int) -> None:
            flow.sent += n
            await asyncio.gather(*(exchange.publish(aio_pika.Message(PAYLOAD, delivery_mode=2), AMQP_QUEUE)
                                   for _ in range(n)))
            flow.confirmed += n

        await paced(rate, stop, send)
        await asyncio.sleep(2.0)  # deliveries on their way
    finally:
        await producer.close()
        await consumer.close()


async def soak(minutes: int, qos1_rate: float, qos0_rate: float, amqp_rate: float, max_slope: float) -> int:
    broker, amqp_port, metrics_port = start_gateway()
    proc = psutil.Process(broker.pid)
    port = broker.port
    qos1, qos0, amqp = Flow(), Flow(), Flow()
    stop = asyncio.Event()
    samples: list[tuple[int, float, float]] = []  # (minute, rss, anon)
    try:
        tasks = [asyncio.create_task(subscriber(port, "soak-sub-q1", "soak/q1/+", 1, qos1, stop)),
                 asyncio.create_task(subscriber(port, "soak-sub-q0", "soak/q0/+", 0, qos0, stop))]
        await asyncio.sleep(0.5)  # subscribed
        rss, anon = memory_mb(broker.pid)
        samples.append((0, rss, anon))
        print(f"soak minute=0 rss_mb={rss:.1f} anon_mb={anon:.1f}", flush=True)
        tasks += [asyncio.create_task(mqtt_publisher(port, f"soak-pub-q1-{i}", f"soak/q1/{i}", 1, qos1_rate / 2,
                                                     qos1, stop)) for i in range(2)]
        tasks += [asyncio.create_task(mqtt_publisher(port, "soak-pub-q0", "soak/q0/0", 0, qos0_rate, qos0, stop)),
                  asyncio.create_task(amqp_traffic(amqp_port, amqp_rate, amqp, stop))]
        started = time.monotonic()
        for minute in range(1, minutes + 1):
            await asyncio.sleep(max(0.0, started + 60 * minute - time.monotonic()))
            for task in tasks:
                if task.done() and task.exception():
                    raise task.exception()  # type: ignore[misc]
            rss, anon = memory_mb(broker.pid)
            memtables, blocks, queue_cache = await asyncio.to_thread(
                gauges, metrics_port, "tidemq_store_memtable_bytes", "tidemq_store_block_cache_bytes",
                "tidemq_queue_cache_bytes")
            samples.append((minute, rss, anon))
            print(f"soak minute={minute} rss_mb={rss:.1f} anon_mb={anon:.1f} memtable_mb={memtables / 2**20:.1f} "
                  f"block_cache_mb={blocks / 2**20:.1f} queue_cache_mb={queue_cache / 2**20:.1f} "
                  f"fds={proc.num_fds()} qos1={qos1} qos0={qos0} amqp={amqp}", flush=True)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(2.0)  # deliveries still on their way
    except BaseException:
        print("soak aborted; the gateway's warnings and errors:", file=sys.stderr)
        for line in (broker.workdir / "console.log").read_text(errors="replace").splitlines():
            if "level=info" not in line:
                print("  " + line, file=sys.stderr)
        raise
    finally:
        broker.stop()
    slope = slope_per_10min([(m, anon) for m, _, anon in samples if m > WARM_UP_MIN])
    print(f"soak minutes={minutes} rss_start_mb={samples[0][1]:.1f} rss_end_mb={samples[-1][1]:.1f} "
          f"anon_slope_mb_per_10min={slope:.2f}", flush=True)
    problems = []
    if slope >= max_slope:
        problems.append(f"anonymous memory rose {slope:.2f} MiB per 10 minutes after minute {WARM_UP_MIN}")
    for name, flow in (("MQTT QoS 1", qos1), ("AMQP", amqp)):
        if flow.received < flow.confirmed:
            problems.append(f"{name}: {flow.confirmed - flow.received} confirmed messages not received")
    print(f"soak result={'FAIL' if problems else 'PASS'} qos1={qos1} qos0={qos0} amqp={amqp}"
          + (f' reason="{"; ".join(problems)}"' if problems else ""), flush=True)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = runner.parser(__doc__, out=False)
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--qos1-rate", type=float, default=1000.0, help="MQTT QoS 1 publishes per second")
    parser.add_argument("--qos0-rate", type=float, default=500.0, help="MQTT QoS 0 publishes per second")
    parser.add_argument("--amqp-rate", type=float, default=500.0, help="AMQP publishes per second")
    parser.add_argument("--max-slope", type=float, default=5.0, help="MiB per 10 minutes, after the warm-up")
    args = parser.parse_args(argv)
    return asyncio.run(soak(args.minutes, args.qos1_rate, args.qos0_rate, args.amqp_rate, args.max_slope))


if __name__ == "__main__":
    sys.exit(main())
