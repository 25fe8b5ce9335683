"""Test helpers: a real gateway on an ephemeral loopback port, a paho-mqtt wrapper usable from
async tests, and a raw-socket client (our codec) for exact packet-level assertions."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from gateway.config import Config
from gateway.server import Gateway
from protocols.mqtt.codec import PacketReader, encode
from protocols.mqtt.packets import MQTT_3_1_1, MQTT_5, Connect, Packet

TIMEOUT = 5.0


@contextlib.asynccontextmanager
async def running_gateway(data_dir: Path, port: int = 0, **config: Any) -> AsyncIterator[Gateway]:
    config.setdefault("amqp_bind", "")
    cfg = Config(data_dir=data_dir, mqtt_bind=f"127.0.0.1:{port}", remoting_bind="", **config)
    gw = Gateway(cfg)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


def mqtt_port(gw: Gateway) -> int:
    return next(listener.address[1] for listener in gw.listeners if listener.protocol == "mqtt")


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Any


class PahoClient:
    """paho-mqtt in its own network thread; received messages land in a thread-safe queue."""

    def __init__(self, port: int, client_id: str, *, version: int = MQTT_3_1_1, clean: bool = True,
                 session_expiry: int | None = None, will: tuple | None = None,
                 username: str | None = None, password: str | None = None, keepalive: int = 60,
                 host: str = "127.0.0.1") -> None:
        proto = paho.MQTTv5 if version == MQTT_5 else paho.MQTTv311
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": proto}
        if version != MQTT_5:
            kwargs["clean_session"] = clean
        self.client = paho.Client(CallbackAPIVersion.VERSION2, **kwargs)
        self.version = version
        self.host, self.port = host, port
        self.clean = clean
        self.session_expiry = session_expiry
        self.keepalive = keepalive
        self.messages: queue.Queue[Received] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.connack: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.on_message = lambda c, u, m: self.messages.put(
            Received(m.topic, m.payload, m.qos, bool(m.retain), getattr(m, "properties", None)))
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        self.client.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props) if props else (flags, rc, None))
        if will is not None:
            self.client.will_set(*will)
        if username is not None:
            self.client.username_pw_set(username, password)

    async def connect(self) -> tuple:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties as PahoProps

        props = None
        kwargs: dict[str, Any] = {}
        if self.version == MQTT_5:
            kwargs["clean_start"] = self.clean
            if self.session_expiry is not None:
                props = PahoProps(PacketTypes.CONNECT)
                props.SessionExpiryInterval = self.session_expiry
            kwargs["properties"] = props
        await asyncio.to_thread(self.client.connect, self.host, self.port, self.keepalive, **kwargs)
        self.client.loop_start()
        return await asyncio.to_thread(self.connack.get, True, TIMEOUT)

    async def subscribe(self, *args: Any, **kwargs: Any) -> None:
        done = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()
        self.client.on_subscribe = lambda c, u, mid, codes, props: loop.call_soon_threadsafe(
            lambda: done.done() or done.set_result(codes))
        result, _ = self.client.subscribe(*args, **kwargs)
        assert result == paho.MQTT_ERR_SUCCESS
        return await asyncio.wait_for(done, TIMEOUT)

    async def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False,
                      properties: Any = None) -> None:
        info = self.client.publish(topic, payload, qos, retain, properties)
        if qos:
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
            assert info.is_published()

    async def receive(self, count: int, timeout: float = TIMEOUT) -> list[Received]:
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"received {len(got)} of {count} messages: {got}")
            try:
                got.append(await asyncio.to_thread(self.messages.get, True, min(left, 0.5)))
            except queue.Empty:
                continue
        return got

    async def nothing_more(self, wait: float = 0.5) -> None:
        await asyncio.sleep(wait)
        assert self.messages.empty(), f"unexpected message {self.messages.get_nowait()}"

    async def disconnect(self) -> None:
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)

    def drop(self) -> None:
        """Lose the connection without DISCONNECT (the will fires)."""
        self.client.loop_stop()
        self.client.socket().close()


class RawClient:
    """A client on a plain socket speaking through our codec: exact packets in and out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version
        self.codec = PacketReader(version=version)
        self.pending: list[Packet] = []

    @classmethod
    async def open(cls, port: int, version: int = MQTT_5) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, version)

    @classmethod
    async def connected(cls, port: int, connect: Connect) -> tuple[RawClient, Packet]:
        client = await cls.open(port, connect.version)
        client.send(connect)
        return client, await client.recv()

    def send(self, packet: Packet) -> None:
        self.writer.write(encode(packet, self.version))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = TIMEOUT) -> Packet:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionResetError("closed by the server")
            self.codec.feed(data)
            self.pending.extend(self.codec.packets())
        return self.pending.pop(0)

    async def closed(self, timeout: float = TIMEOUT) -> list[Packet]:
        """Read until the server closes; the packets it sent before closing."""
        got = list(self.pending)
        self.pending.clear()
        deadline = time.monotonic() + timeout
        while True:
            data = await asyncio.wait_for(self.reader.read(65536), max(0.01, deadline - time.monotonic()))
            if not data:
                return got
            self.codec.feed(data)
            got.extend(self.codec.packets())

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


async def receive_numbers(client: PahoClient, wanted: set[int], timeout_s: float = 20.0) -> set[int]:
    """The numbers (message payloads) ``client`` receives until it has all of ``wanted`` or the
    time is up."""
    got: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while not wanted <= got and time.monotonic() < deadline:
        try:
            for message in await client.receive(1, timeout=1.0):
                got.add(int(message.payload))
        except AssertionError:
            continue
    return got
