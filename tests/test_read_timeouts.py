"""Connections that stop sending: a frame begun and not finished is closed after
``read_timeout_s`` of silence on every listener, whatever keep-alive or heartbeat was agreed
(none, here); a remoting connection without requests (heartbeats) for
``remoting_idle_timeout_s`` is closed, as RocketMQ's broker does, and real clients that
heartbeat stay connected."""

from __future__ import annotations

import asyncio
import logging
import struct
import sys
from pathlib import Path

import pika
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from gateway.cluster.remote_store import RemoteStore
from gateway.config import Config
from gateway.server import Gateway
from protocols.mqtt.codec import encode
from protocols.mqtt.packets import MQTT_3_1_1, Connect
from protocols.remoting.codes import RequestCode, ResponseCode

from .amqp_support import RawAMQP
from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway
from .remoting_support import OnsProcess, RawRemoting, ons, remoting_gateway

READ_TIMEOUT_S = 0.5
ANNOUNCED = 16 << 20  # a whole remoting frame's worth, of which a little is sent
SENT = 64 << 10


async def closed_by_server(reader: asyncio.StreamReader, within_s: float = 5.0) -> bool:
    """True once the server closes the connection (read returns EOF or it is reset)."""
    try:
        while await asyncio.wait_for(reader.read(65536), within_s):
            pass
    except ConnectionResetError:
        pass
    return True


@pytest.fixture
def access_keys(tmp_path: Path) -> dict:
    keys = tmp_path / "access_keys"
    keys.write_text("AK-alice sk-alice alice\n")
    keys.chmod(0o600)
    return {"access_keys_file": str(keys), "allow_anonymous": False}


# -- remoting -------------------------------------------------------------------------------
async def test_remoting_partial_frame_after_a_refused_request_is_closed(data_dir: Path, access_keys: dict) -> None:
    async with remoting_gateway(data_dir, read_timeout_s=READ_TIMEOUT_S, **access_keys) as (gw, addr):
        raw = await RawRemoting.open(addr)
        refused = await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        assert refused.code == ResponseCode.NO_PERMISSION  # unsigned
        raw.writer.write(struct.pack(">i", ANNOUNCED - 4) + b"\x00" * SENT)  # then nothing more
        await raw.writer.drain()
        await asyncio.sleep(0.1)
        (conn,) = gw.remoting.connections
        # what the unfinished frame holds is what was sent, not what it announced
        assert conn.reader.buffered == 4 + SENT and sys.getsizeof(conn.reader._buffer) < 2 * SENT
        assert await closed_by_server(raw.reader)
        assert not gw.remoting.connections
        raw.close()


async def test_remoting_connection_without_requests_is_closed(data_dir: Path, caplog) -> None:
    caplog.set_level(logging.INFO, "tidemq.remoting")
    async with remoting_gateway(data_dir, remoting_idle_timeout_s=0.5) as (gw, addr):
        raw = await RawRemoting.open(addr)
        assert (await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})).code == ResponseCode.SUCCESS
        assert await closed_by_server(raw.reader)
        assert any("idle" in r.getMessage() for r in caplog.records)
        raw.close()


async def test_ali_ons_heartbeats_keep_its_connections(data_dir: Path, caplog) -> None:
    """The idle timeout is several heartbeat intervals: a consumer that heartbeats (ali-ons,
    1 s here as every test sets it; 30 s by default, against 120 s of the gateway's) and holds
    its pulls longer than the timeout is never closed."""
    caplog.set_level(logging.INFO, "tidemq.remoting")
    async with remoting_gateway(data_dir, remoting_idle_timeout_s=3.0, remoting_long_poll_max_s=10.0) as (gw, addr):
        await ons({"cmd": "send", "nameSrv": addr, "topic": "T", "messages": [{"body": "first"}]})
        consumer = await OnsProcess.start({"cmd": "consume", "nameSrv": addr, "group": "g", "topic": "T",
                                           "count": 2, "timeoutMs": 40_000, "fromFirst": True})
        try:
            assert (await consumer.until("message"))["body"] == "first"
            opened = gw.remoting.stats.connections_total
            await asyncio.sleep(8.0)  # more than twice the idle timeout, nothing to consume
            assert gw.remoting.stats.connections_total == opened  # (ali-ons reconnects if closed)
            await ons({"cmd": "send", "nameSrv": addr, "topic": "T", "messages": [{"body": "second"}]})
            assert (await consumer.until("message"))["body"] == "second"
        finally:
            consumer.kill()
        assert not any("idle" in r.getMessage() for r in caplog.records)


# -- MQTT -----------------------------------------------------------------------------------
@pytest.mark.parametrize("keep_alive", [0, 65535])
async def test_mqtt_partial_publish_is_closed(data_dir: Path, keep_alive: int) -> None:
    async with running_gateway(data_dir, read_timeout_s=READ_TIMEOUT_S) as gw:
        port = mqtt_port(gw)
        raw, connack = await RawClient.connected(port, Connect("stuck", MQTT_3_1_1, keep_alive=keep_alive))
        assert connack.reason_code == 0
        # a PUBLISH announcing 500,000 bytes (remaining length as a varint), then a few
        raw.send_raw(b"\x30" + bytes((0xA0, 0xC2, 0x1E)) + b"\x00\x01t" + b"x" * 1000)
        quiet = PahoClient(port, "quiet", keepalive=0)  # idle but whole: stays
        await quiet.connect()
        assert await closed_by_server(raw.reader)
        await quiet.subscribe("t/#", qos=1)
        await quiet.publish("t/1", b"still here", qos=1)
        assert [m.payload for m in await quiet.receive(1)] == [b"still here"]
        await quiet.disconnect()


async def test_mqtt_partial_connect_is_closed_by_the_connect_timeout(data_dir: Path) -> None:
    async with running_gateway(data_dir, connect_timeout_s=0.5, read_timeout_s=60.0) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", mqtt_port(gw))
        writer.write(b"\x10\x7f\x00\x04MQTT")  # a CONNECT, unfinished
        assert await closed_by_server(reader)
        writer.close()


async def test_mqtt_websocket_partial_frame_is_closed(data_dir: Path) -> None:
    async with running_gateway(data_dir, read_timeout_s=READ_TIMEOUT_S, ws_bind="127.0.0.1:0") as gw:
        port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "ws")

        def stuck() -> None:
            with ws_connect(f"ws://127.0.0.1:{port}/mqtt", subprotocols=["mqtt"]) as ws:
                ws.send(encode(Connect("ws-stuck", MQTT_3_1_1, keep_alive=0), MQTT_3_1_1))
                assert ws.recv(timeout=5)[:1] == b"\x20"  # CONNACK
                # a binary frame announcing 65,536 bytes (masked, as a client's), a little of it sent
                ws.socket.sendall(b"\x82\xff" + struct.pack(">Q", 65536) + b"\x00" * 4 + b"x" * 1000)
                with pytest.raises(ConnectionClosed):
                    ws.recv(timeout=5)

        await asyncio.wait_for(asyncio.to_thread(stuck), 10)


# -- AMQP -----------------------------------------------------------------------------------
async def test_amqp_partial_frame_without_heartbeats_is_closed(data_dir: Path) -> None:
    async with running_gateway(data_dir, read_timeout_s=READ_TIMEOUT_S, amqp_bind="127.0.0.1:0") as gw:
        port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        raw = await RawAMQP.open(port)  # heartbeat 0 in its tune-ok
        raw.writer.write(struct.pack(">BHI", 1, 1, 100_000) + b"\x00" * 1000)  # a method frame, unfinished
        quiet = await asyncio.to_thread(pika.BlockingConnection, pika.ConnectionParameters(
            "127.0.0.1", port, heartbeat=0))
        assert await closed_by_server(raw.reader)
        assert len(gw.amqp.connections) == 1
        channel = await asyncio.to_thread(quiet.channel)  # idle without heartbeats, but whole: stays
        await asyncio.to_thread(channel.queue_declare, "q")
        await asyncio.to_thread(quiet.close)


# -- HTTP (metrics, admin, data API) --------------------------------------------------------
async def test_http_unfinished_request_is_closed(data_dir: Path) -> None:
    async with running_gateway(data_dir, read_timeout_s=READ_TIMEOUT_S, metrics_bind="127.0.0.1:0") as gw:
        host, port = gw.metrics_address
        silent = await asyncio.open_connection(host, port)
        unfinished = await asyncio.open_connection(host, port)
        unfinished[1].write(b"GET /metrics HTTP/1.1\r\nHost: tidemq\r\n")  # the headers' end never comes
        assert await closed_by_server(silent[0])
        assert await closed_by_server(unfinished[0])
        for _, writer in (silent, unfinished):
            writer.close()


async def test_store_link_is_not_closed_for_idleness(data_dir: Path) -> None:
    """A gateway node's link says HELLO, then may be quiet as long as its clients are."""
    gw = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0",
                        remoting_idle_timeout_s=0.3))
    await gw.start()
    try:
        port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "remoting")
        remote = await RemoteStore.connect("127.0.0.1", port)
        stranger = await RawRemoting.open(f"127.0.0.1:{port}")
        assert (await stranger.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})).code == ResponseCode.SUCCESS
        assert await closed_by_server(stranger.reader)  # the same timeout closes an ordinary client
        assert remote.link.is_open
        assert await remote.max_offset("t:a") == 0
        await remote.close()
    finally:
        await gw.stop()
