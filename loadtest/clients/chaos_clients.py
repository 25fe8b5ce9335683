"""The clients of the chaos script, each reconnecting when a node drops it and reporting to a
Tally (loadtest/chaos_tally.py): MQTT QoS 1 publishers and a persistent-session subscriber
(paho), an AMQP publisher with confirms and a manual-ack consumer (aio-pika), and ali-ons
under node for RocketMQ remoting (chaos_remoting.js)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import aio_pika
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from loadtest.chaos_tally import Tally
from tests.crash_support import ROOT

HOST = "127.0.0.1"
START_S = 60.0
ACK_TIMEOUT_S = 10.0
AMQP_QUEUE = "chaos"
REMOTING_TOPIC = "chaos"
MQTT_FILTER = "chaos/+/+"  # the MQTT publishers' topics only (chaos/# matches REMOTING_TOPIC too)
ONS_DRIVER = Path(__file__).with_name("chaos_remoting.js")
NODE_MODULES = ROOT / "tests" / "remoting_js" / "node_modules"


class Connections:
    """How many times each client connected: a client a failover dropped connects again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def made(self, client: str) -> None:
        with self._lock:
            self._counts[client] = self._counts.get(client, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


# -- MQTT --------------------------------------------------------------------------------------
def message_round(message_id: str) -> str:
    """The round tag of a message id ``TAG/PUBLISHER/SEQ``."""
    return message_id.split("/", 1)[0]


class MqttPublisher(threading.Thread):
    """QoS 1, ``window`` messages in flight, each message again (a new PUBLISH) until its
    PUBACK; a new clean connection after a disconnect or ACK_TIMEOUT_S without any PUBACK."""

    def __init__(self, port: int, name: str, tag: str, tally: Tally, connections: Connections,
                 window: int = 1) -> None:
        super().__init__(daemon=True)
        self.port, self.name_, self.tag, self.tally = port, name, tag, tally
        self.connections, self.window = connections, window
        self.halt = threading.Event()
        self._acked: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._lost = False

    def _connect(self) -> paho.Client | None:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"chaos-{self.name_}", clean_session=True)
        client.max_inflight_messages_set(self.window)
        connected = threading.Event()
        acked: queue.SimpleQueue[int | None] = queue.SimpleQueue()  # this connection's PUBACKs (None: lost)
        client.on_connect = lambda c, u, flags, rc, props: (not rc.is_failure) and connected.set()
        client.on_publish = lambda c, u, mid, rc, props: acked.put(mid)

        def lost(c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
            self._lost = True
            acked.put(None)

        client.on_disconnect = lost
        try:
            client.connect(HOST, self.port, keepalive=10)
        except OSError:
            return None
        self._lost = False
        self._acked = acked
        client.loop_start()
        if not connected.wait(5) or self._lost:
            self._close(client)
            return None
        self.connections.made("mqtt_publishers")
        return client

    @staticmethod
    def _close(client: paho.Client) -> None:
        with contextlib.suppress(Exception):
            client.disconnect()
        client.loop_stop()

    def run(self) -> None:
        seq = 0
        again: list[str] = []  # sent on a connection that ended before their PUBACK
        while not self.halt.is_set():
            client = self._connect()
            if client is None:
                time.sleep(0.1)
                continue
            inflight: dict[int, str] = {}  # packet id -> message id
            try:
                while not self.halt.is_set() and not self._lost:
                    while len(inflight) < self.window:
                        if again:
                            message_id = again.pop(0)
                        else:
                            message_id, seq = f"{self.tag}/{self.name_}/{seq}", seq + 1
                        self.tally.on_sent(message_id)
                        info = client.publish(f"chaos/{self.tag}/{self.name_}", message_id, qos=1)
                        inflight[info.mid] = message_id
                    try:
                        mid = self._acked.get(timeout=ACK_TIMEOUT_S)
                    except queue.Empty:
                        break
                    while mid is not None:
                        message_id = inflight.pop(mid, None)
                        if message_id is not None:
                            self.tally.on_acked(message_id, time.monotonic())
                        try:
                            mid = self._acked.get_nowait()
                        except queue.Empty:
                            break
            finally:
                self._close(client)
                again = [*inflight.values(), *again]


class MqttSubscriber:
    """A persistent session (clean_session false) subscribed to chaos/+/+ at QoS 1, reconnected
    by paho; each delivery goes to the tally of its round."""

    def __init__(self, port: int, tallies: dict[str, Tally], connections: Connections) -> None:
        self.tallies = tallies
        self.connections = connections
        self.sessions_lost = 0
        self._connected_once = False
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id="chaos-subscriber", clean_session=False)
        self.client.reconnect_delay_set(0.1, 1)
        self.client.on_connect = self._on_connect
        self.subscribed = threading.Event()
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subscribed.set()
        self.client.on_message = self._on_message
        self.port = port

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        if rc.is_failure:
            return
        if not flags.session_present:
            if self._connected_once:
                self.sessions_lost += 1
            client.subscribe(MQTT_FILTER, 1)
        self._connected_once = True
        self.connections.made("mqtt_subscriber")

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        message_id = message.payload.decode()
        tally = self.tallies.get(message_round(message_id))
        if tally is not None:
            tally.on_delivered(message_id, bool(message.dup))

    def start(self, timeout_s: float = START_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.connect(HOST, self.port, keepalive=10)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.client.loop_start()
        if not self.subscribed.wait(timeout_s):  # messages published before the SUBACK are not ours to count
            raise RuntimeError("the MQTT subscriber's SUBSCRIBE was not acknowledged")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.disconnect()
        self.client.loop_stop()


# -- AMQP --------------------------------------------------------------------------------------
async def amqp_connect(port: int) -> aio_pika.abc.AbstractConnection:
    return await asyncio.wait_for(aio_pika.connect(f"amqp://guest:guest@{HOST}:{port}/", timeout=5), 10)


async def amqp_publisher(port: int, tag: str, tally: Tally, halt: asyncio.Event, connections: Connections,
                         window: int = 1) -> None:
    """Persistent messages to the durable queue, confirms on, ``window`` unconfirmed at most,
    each again until confirmed; a new connection after anything but a nack."""
    seq = 0
    again: list[str] = []  # nacked, or sent on a connection that ended before their confirm
    while not halt.is_set():
        connection = None
        inflight: dict[asyncio.Future, str] = {}
        try:
            connection = await amqp_connect(port)
            channel = await connection.channel()
            await channel.declare_queue(AMQP_QUEUE, durable=True)
            connections.made("amqp_publisher")
            while not halt.is_set():
                while len(inflight) < window:
                    if again:
                        message_id = again.pop(0)
                    else:
                        message_id, seq = f"{tag}/amqp/{seq}", seq + 1
                    tally.on_sent(message_id)
                    message = aio_pika.Message(message_id.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                    confirm = asyncio.ensure_future(asyncio.wait_for(
                        channel.default_exchange.publish(message, routing_key=AMQP_QUEUE), ACK_TIMEOUT_S))
                    inflight[confirm] = message_id
                done, _ = await asyncio.wait(list(inflight), return_when=asyncio.FIRST_COMPLETED)
                broken = None
                for confirm in done:
                    message_id = inflight.pop(confirm)
                    error = confirm.exception()
                    if error is None:
                        tally.on_acked(message_id, time.monotonic())
                    else:
                        again.append(message_id)
                        if not isinstance(error, aio_pika.exceptions.DeliveryError):  # (a nack: not replicated)
                            broken = error
                if broken is not None:
                    raise broken
                if len(again) >= window:
                    await asyncio.sleep(0.05)  # nacked: the group refuses writes for now
        except Exception:  # noqa: BLE001 (any failure of the connection: connect again)
            await asyncio.sleep(0.1)
        finally:
            for confirm in inflight:
                confirm.cancel()
            again = [*inflight.values(), *again]
            if connection is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 5)


async def amqp_consumer(port: int, tallies: dict[str, Tally], halt: asyncio.Event,
                        connections: Connections) -> None:
    """basic.consume with manual acks on the durable queue, connected again whenever it drops."""
    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        message_id = message.body.decode()
        tally = tallies.get(message_round(message_id))
        if tally is not None:
            tally.on_delivered(message_id, bool(message.redelivered))
        await message.ack()

    while not halt.is_set():
        connection = None
        try:
            connection = await amqp_connect(port)
            channel = await connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=200)
            queue = await channel.declare_queue(AMQP_QUEUE, durable=True)
            await queue.consume(on_message)
            connections.made("amqp_consumer")
            while not halt.is_set() and not channel.is_closed and not connection.is_closed:
                await asyncio.sleep(0.2)
        except Exception:  # noqa: BLE001
            await asyncio.sleep(0.2)
        finally:
            if connection is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 5)


# -- RocketMQ remoting (ali-ons) ----------------------------------------------------------------
class OnsDriver:
    """One loadtest/chaos_remoting.js process (ali-ons under node); each JSON line it prints
    goes to ``on_event`` as it comes. It runs until its stdin is closed."""

    def __init__(self, proc: asyncio.subprocess.Process, reader: asyncio.Task) -> None:
        self.proc, self.reader = proc, reader

    @classmethod
    async def start(cls, spec: dict[str, Any], on_event, home: Path, log: Path) -> OnsDriver:
        if not (NODE_MODULES / "ali-ons").is_dir():
            raise RuntimeError("ali-ons is not installed: npm ci --prefix tests/remoting_js")
        with open(log, "a") as stderr:
            proc = await asyncio.create_subprocess_exec(
                "node", str(ONS_DRIVER), json.dumps(spec), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=stderr,
                env={**os.environ, "NODE_PATH": str(NODE_MODULES), "HOME": str(home)})

        async def read() -> None:
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                on_event(json.loads(line))

        return cls(proc, asyncio.ensure_future(read()))

    async def stop(self, timeout_s: float = 30.0) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        await asyncio.wait([self.reader], timeout=5)


def on_producer_event(tally: Tally):
    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "sending":
            tally.on_sent(event["id"])
        elif event["event"] == "sent":
            tally.on_acked(event["id"], time.monotonic())
    return on_event


def on_consumer_event(tallies: dict[str, Tally], ready: asyncio.Event):
    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "ready":
            ready.set()
        elif event["event"] == "message":
            tally = tallies.get(message_round(event["id"]))
            if tally is not None:
                tally.on_delivered(event["id"], event["reconsumeTimes"] > 0)
    return on_event


async def start_ons_producer(name_servers: list[str], tag: str, tally: Tally, home: Path, log_dir: Path) -> OnsDriver:
    """An ali-ons producer of the messages ``TAG/rmq/N`` to the chaos topic."""
    return await OnsDriver.start({"cmd": "produce", "nameSrv": name_servers, "topic": REMOTING_TOPIC, "tag": tag},
                                 on_producer_event(tally), home, log_dir / "ons-producer.log")


async def start_ons_consumer(name_servers: list[str], tallies: dict[str, Tally], home: Path,
                             log_dir: Path) -> OnsDriver:
    """The topic made by a first SEND_OK, then a push consumer from its first offset."""
    warmup = Tally()
    producer = await start_ons_producer(name_servers, "warmup", warmup, home, log_dir)
    deadline = time.monotonic() + START_S
    while not warmup.acked_at and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await producer.stop()
    if not warmup.acked_at:
        raise RuntimeError("ali-ons: no SEND_OK at the start")
    ready = asyncio.Event()
    consumer = await OnsDriver.start({"cmd": "consume", "nameSrv": name_servers, "topic": REMOTING_TOPIC,
                                      "group": "chaos-consumer"}, on_consumer_event(tallies, ready), home,
                                     log_dir / "ons-consumer.log")
    await asyncio.wait_for(ready.wait(), START_S)
    return consumer
