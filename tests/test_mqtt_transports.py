"""MQTT over TLS and over WebSocket, through paho-mqtt's own TLS and WebSocket transports."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from .mqtt_support import TIMEOUT, PahoClient, mqtt_port, running_gateway


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


def listener_port(gw, protocol: str) -> int:
    return next(listener.address[1] for listener in gw.listeners if listener.protocol == protocol)


async def roundtrip(client: paho.Client, port: int) -> list[bytes]:
    got: asyncio.Queue[bytes] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    subscribed = loop.create_future()
    client.on_message = lambda c, u, m: loop.call_soon_threadsafe(got.put_nowait, m.payload)
    client.on_subscribe = lambda *a: loop.call_soon_threadsafe(lambda: subscribed.done() or subscribed.set_result(1))
    await asyncio.to_thread(client.connect, "127.0.0.1", port)
    client.loop_start()
    client.subscribe("secure/#", 1)
    await asyncio.wait_for(subscribed, TIMEOUT)
    client.publish("secure/a", b"over the wire", 1)
    payload = await asyncio.wait_for(got.get(), TIMEOUT)
    client.disconnect()
    await asyncio.to_thread(client.loop_stop)
    return [payload]


async def test_mqtt_over_tls(data_dir: Path, certificate: tuple[str, str]) -> None:
    cert, key = certificate
    async with running_gateway(data_dir, mqtts_bind="127.0.0.1:0", tls_cert_file=cert, tls_key_file=key) as gw:
        port = listener_port(gw, "mqtts")
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="tls-client")
        client.tls_set(ca_certs=cert, cert_reqs=ssl.CERT_REQUIRED)
        assert await roundtrip(client, port) == [b"over the wire"]
        plain = PahoClient(mqtt_port(gw), "plain")  # the plain listener shares the same broker
        await plain.connect()
        await plain.disconnect()


async def test_mqtt_over_websocket(data_dir: Path) -> None:
    async with running_gateway(data_dir, ws_bind="127.0.0.1:0") as gw:
        port = listener_port(gw, "ws")
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="ws-client", transport="websockets")
        client.ws_set_options(path="/mqtt")
        assert await roundtrip(client, port) == [b"over the wire"]
        watcher = PahoClient(mqtt_port(gw), "tcp-watcher")  # WebSocket and TCP clients meet
        await watcher.connect()
        await watcher.subscribe("secure/#", 0)
        ws_pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="ws-pub", transport="websockets")
        await asyncio.to_thread(ws_pub.connect, "127.0.0.1", port)
        ws_pub.loop_start()
        ws_pub.publish("secure/b", b"from ws", 1).wait_for_publish(TIMEOUT)
        assert [m.payload for m in await watcher.receive(1)] == [b"from ws"]
        ws_pub.disconnect()
        await asyncio.to_thread(ws_pub.loop_stop)
        await watcher.disconnect()
