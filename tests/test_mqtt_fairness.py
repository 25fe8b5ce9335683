"""Fan-in at QoS 0 through raw sockets: publishers that send as fast as they can do not starve a
subscriber that keeps reading (nothing is dropped for it), and a subscriber that stops reading
is still cut to its bound without holding the publishers (gateway/mqtt/ingest_gate.py)."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

from protocols.mqtt.codec import encode
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    Connect,
    Disconnect,
    Publish,
    Subscribe,
    Subscription,
)

from .mqtt_support import RawClient, mqtt_port, running_gateway

PUBLISHERS = 4
PER_PUBLISHER = 12_500  # 50,000 messages of 64 bytes in all
PAYLOAD = b"p" * 64
IDLE_S = 3.0  # a reader stops when nothing came for this long


def _connect(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(encode(Connect(client_id, MQTT_3_1_1, keep_alive=600), MQTT_3_1_1))
    assert sock.recv(4) == b"\x20\x02\x00\x00"
    return sock


def _publish_all(port: int, index: int, count: int, payload: bytes, done: threading.Event) -> None:
    """Send every message in one go, as fast as the socket takes them."""
    sock = _connect(port, f"blast-{index}")
    try:
        sock.sendall(encode(Publish(f"fan/{index}", payload, 0), MQTT_3_1_1) * count)
        done.wait(60)
        sock.sendall(encode(Disconnect(), MQTT_3_1_1))
    finally:
        sock.close()


def _subscribe(port: int, client_id: str) -> socket.socket:
    sock = _connect(port, client_id)
    sock.sendall(encode(Subscribe(1, [Subscription("fan/+", 0)]), MQTT_3_1_1))
    assert sock.recv(5) == b"\x90\x03\x00\x01\x00"
    return sock


def _read_continuously(sock: socket.socket, expected_bytes: int, got: list[int]) -> None:
    """Read as fast as the socket gives, until everything or nothing for IDLE_S."""
    buf = bytearray(1 << 20)
    total = 0
    sock.settimeout(IDLE_S)
    try:
        while total < expected_bytes:
            n = sock.recv_into(buf)
            if not n:
                break
            total += n
    except TimeoutError:
        pass
    got.append(total)


async def _fan_in(port: int, reader: socket.socket, count: int = PER_PUBLISHER, payload: bytes = PAYLOAD) -> int:
    """Blast PUBLISHERS x ``count`` QoS 0 messages at ``fan/+`` while ``reader`` reads
    continuously; the number of messages it got."""
    size = len(encode(Publish("fan/0", payload, 0), MQTT_3_1_1))
    got: list[int] = []
    done = threading.Event()
    threads = [threading.Thread(target=_read_continuously, args=(reader, PUBLISHERS * count * size, got))]
    threads += [threading.Thread(target=_publish_all, args=(port, i, count, payload, done))
                for i in range(PUBLISHERS)]
    for thread in threads:
        thread.start()
    await asyncio.to_thread(threads[0].join, 60)
    done.set()
    for thread in threads[1:]:
        await asyncio.to_thread(thread.join, 10)
    assert got and got[0] % size == 0
    return got[0] // size


async def test_qos0_subscriber_that_keeps_reading_gets_every_message(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:  # the default bound: 1,000 queued QoS 0 messages
        port = mqtt_port(gw)
        sub = await asyncio.to_thread(_subscribe, port, "reader")
        try:
            received = await _fan_in(port, sub)
        finally:
            sub.close()
        assert gw.mqtt.stats.publish_dropped == 0
        assert received == PUBLISHERS * PER_PUBLISHER
        assert gw.store.max_offset_now("w:fan/+") == PUBLISHERS * PER_PUBLISHER


async def test_subscriber_that_stops_reading_is_cut_and_holds_nobody(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        stalled, _ = await RawClient.connected(port, Connect("stalled", MQTT_3_1_1))
        stalled.send(Subscribe(1, [Subscription("fan/+", 0)]))
        await stalled.recv()
        stalled.writer.transport.pause_reading()  # never reads again: its socket fills up
        sub = await asyncio.to_thread(_subscribe, port, "reader")
        try:  # 20 MB: more than the stalled client's socket buffers take
            received = await _fan_in(port, sub, 5_000, b"s" * 1024)
        finally:
            sub.close()
        # the publishers waited for the stalled subscriber once, until it counted as stalled
        assert received == PUBLISHERS * 5_000
        conn = gw.mqtt.connections["stalled"]
        assert conn.delivery.pusher.slow and not gw.mqtt.gate.waiting and not gw.mqtt.gate.held
        assert gw.mqtt.stats.publish_dropped > 0
        assert conn.transport.get_write_buffer_size() <= 2 << 20  # bounded, not the 20 MB sent
        await stalled.close()
