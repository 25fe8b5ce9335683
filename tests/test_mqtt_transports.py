"""MQTT over TLS and over WebSocket, through paho-mqtt's own TLS and WebSocket transports."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from gateway.config import Config
from gateway.server import Gateway

from .mqtt_support import TIMEOUT, PahoClient, mqtt_port, running_gateway

ROOT = Path(__file__).resolve().parent.parent


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


async def roundtrip(client: paho.Client, port: int, host: str = "127.0.0.1") -> list[bytes]:
    got: asyncio.Queue[bytes] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    subscribed = loop.create_future()
    client.on_message = lambda c, u, m: loop.call_soon_threadsafe(got.put_nowait, m.payload)
    client.on_subscribe = lambda *a: loop.call_soon_threadsafe(lambda: subscribed.done() or subscribed.set_result(1))
    await asyncio.to_thread(client.connect, host, port)
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


async def test_tls_and_websocket_listeners_without_the_plain_one(data_dir: Path,
                                                                 certificate: tuple[str, str]) -> None:
    """A TLS-only (and WebSocket) deployment: mqtt_bind empty, the other MQTT listeners still start."""
    cert, key = certificate
    gw = Gateway(Config(data_dir=data_dir, mqtt_bind="", amqp_bind="", remoting_bind="",
                        mqtts_bind="127.0.0.1:0", ws_bind="127.0.0.1:0", tls_cert_file=cert, tls_key_file=key))
    await gw.start()
    try:
        assert sorted(listener.protocol for listener in gw.listeners) == ["mqtts", "ws"]
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="tls-only")
        client.tls_set(ca_certs=cert, cert_reqs=ssl.CERT_REQUIRED)
        assert await roundtrip(client, listener_port(gw, "mqtts")) == [b"over the wire"]
        ws = paho.Client(CallbackAPIVersion.VERSION2, client_id="ws-only", transport="websockets")
        assert await roundtrip(ws, listener_port(gw, "ws")) == [b"over the wire"]
    finally:
        await gw.stop()


def test_a_missing_certificate_or_key_is_named(tmp_path: Path, certificate: tuple[str, str]) -> None:
    cert, key = certificate
    missing = str(tmp_path / "nowhere.pem")
    for flags, named in ((["--tls-cert", missing, "--tls-key", key], "tls_cert_file"),
                         (["--tls-cert", cert, "--tls-key", missing], "tls_key_file")):
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path / "data"), "--mqtt-bind", "",
             "--amqp-bind", "", "--remoting-bind", "", "--mqtts-bind", "127.0.0.1:0", *flags],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert named in proc.stderr and missing in proc.stderr and "No such file" in proc.stderr, proc.stderr
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path / "data"), "--mqtt-bind", "",
         "--amqp-bind", "", "--remoting-bind", "", "--mqtts-bind", "127.0.0.1:0",
         "--tls-cert", str(tmp_path / "garbage.pem"), "--tls-key", key],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "garbage.pem" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
