"""Listeners on IPv6: the default binds (``localhost``) answer on both loopbacks, 127.0.0.1 and
::1, on one port; ``[::1]:PORT`` and ``[::]:PORT`` serve every listener to real clients; route
data names an IPv6 broker as ``[host]:port``; without IPv6, ``localhost`` still starts, on
127.0.0.1, with a warning."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path

import paho.mqtt.client as paho
import pika
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from gateway import listen
from gateway.cluster.remote_store import RemoteStore
from gateway.config import Config
from gateway.server import Gateway
from protocols.remoting.codes import RequestCode, ResponseCode

from .mqtt_support import PahoClient
from .remoting_support import RawRemoting, pull_header, send_header
from .test_mqtt_transports import roundtrip


def ports(gw: Gateway, protocol: str) -> set[tuple[str, int]]:
    """The (host, port) of every socket of the listeners of ``protocol``."""
    return {sock.getsockname()[:2] for listener in gw.listeners if listener.protocol == protocol
            for sock in listener.server.sockets}


def port_of(gw: Gateway, protocol: str) -> int:
    (port,) = {port for _, port in ports(gw, protocol)}
    return port


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,IP:::1"],
        check=True, capture_output=True)
    return str(cert), str(key)


def http_get(host: str, port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{listen.format_address(host, port)}{path}", timeout=5) as response:
        return response.read()


async def remoting_client(host: str, port: int) -> RawRemoting:
    return RawRemoting(*await asyncio.open_connection(host, port))


async def mqtt_roundtrip(host: str, port: int, client_id: str) -> None:
    client = PahoClient(port, client_id, host=host)
    await client.connect()
    await client.subscribe(f"v6/{client_id}", qos=1)
    await client.publish(f"v6/{client_id}", b"over " + host.encode(), qos=1)
    assert [m.payload for m in await client.receive(1)] == [b"over " + host.encode()]
    await client.disconnect()


def amqp_roundtrip(host: str, port: int) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters(host, port))
    try:
        channel = connection.channel()
        channel.queue_declare("v6")
        channel.basic_publish("", "v6", b"over " + host.encode())
        _, _, body = channel.basic_get("v6", auto_ack=True)
        assert body == b"over " + host.encode()
    finally:
        connection.close()


def test_default_binds_are_both_loopbacks() -> None:
    cfg = Config()
    assert (cfg.mqtt_bind, cfg.amqp_bind, cfg.remoting_bind) == ("localhost:1883", "localhost:5672", "localhost:9876")


async def test_localhost_answers_on_both_loopbacks_on_one_port(data_dir: Path, certificate: tuple[str, str]) -> None:
    cert, key = certificate
    gw = Gateway(Config(data_dir=data_dir, mqtt_bind="localhost:0", amqp_bind="localhost:0",
                        remoting_bind="localhost:0", ws_bind="localhost:0", mqtts_bind="localhost:0",
                        metrics_bind="localhost:0", tls_cert_file=cert, tls_key_file=key))
    await gw.start()
    try:
        for protocol in ("mqtt", "mqtts", "ws", "amqp", "remoting"):
            port = port_of(gw, protocol)
            assert ports(gw, protocol) == {("127.0.0.1", port), ("::1", port)}, protocol
        for host in ("127.0.0.1", "::1"):
            await mqtt_roundtrip(host, port_of(gw, "mqtt"), f"c-{host}")
            await asyncio.to_thread(amqp_roundtrip, host, port_of(gw, "amqp"))
            raw = await remoting_client(host, port_of(gw, "remoting"))
            route = await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
            assert route.code == ResponseCode.SUCCESS
            # the advertised broker is the first loopback's: reachable from both
            assert json.loads(route.body)["brokerDatas"][0]["brokerAddrs"]["0"] == \
                f"127.0.0.1:{port_of(gw, 'remoting')}"
            raw.close()
            assert await asyncio.to_thread(http_get, host, gw.metrics_address[1], "/healthz")
            tls = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"tls-{host}")
            tls.tls_set(ca_certs=cert, cert_reqs=ssl.CERT_REQUIRED)
            assert await roundtrip(tls, port_of(gw, "mqtts"), host) == [b"over the wire"]
            ws = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"ws-{host}", transport="websockets")
            assert await roundtrip(ws, port_of(gw, "ws"), host) == [b"over the wire"]
    finally:
        await gw.stop()


@pytest.mark.parametrize("host", ["::1", "::"])
async def test_ipv6_binds_serve_every_listener(data_dir: Path, certificate: tuple[str, str], host: str) -> None:
    cert, key = certificate
    bind = f"[{host}]:0"
    gw = Gateway(Config(data_dir=data_dir, mqtt_bind=bind, amqp_bind=bind, remoting_bind=bind, ws_bind=bind,
                        mqtts_bind=bind, metrics_bind=bind, tls_cert_file=cert, tls_key_file=key))
    await gw.start()
    try:
        await mqtt_roundtrip("::1", port_of(gw, "mqtt"), "v6")
        await asyncio.to_thread(amqp_roundtrip, "::1", port_of(gw, "amqp"))
        assert await asyncio.to_thread(http_get, "::1", gw.metrics_address[1], "/healthz")
        tls = paho.Client(CallbackAPIVersion.VERSION2, client_id="tls-v6")
        tls.tls_set(ca_certs=cert, cert_reqs=ssl.CERT_REQUIRED)
        assert await roundtrip(tls, port_of(gw, "mqtts"), "::1") == [b"over the wire"]
        ws = paho.Client(CallbackAPIVersion.VERSION2, client_id="ws-v6", transport="websockets")
        assert await roundtrip(ws, port_of(gw, "ws"), "::1") == [b"over the wire"]
        # remoting: route data names the broker as [host]:port, where a client sends and pulls
        raw = await remoting_client("::1", port_of(gw, "remoting"))
        route = await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        advertised = json.loads(route.body)["brokerDatas"][0]["brokerAddrs"]["0"]
        if host == "::1":
            assert advertised == f"[::1]:{port_of(gw, 'remoting')}"
            broker_host, broker_port = advertised[1:].rsplit("]:", 1)
        else:  # every interface: store_host, the node's IPv4 address
            assert advertised == f"127.0.0.1:{port_of(gw, 'remoting')}"
            broker_host, broker_port = advertised.rsplit(":", 1)
        raw.close()
        broker = await remoting_client(broker_host, int(broker_port))
        assert (await broker.call(RequestCode.SEND_MESSAGE, send_header("T"), b"over ipv6")).code == 0
        pulled = await broker.call(RequestCode.PULL_MESSAGE, pull_header("T", 0))
        assert pulled.code == ResponseCode.SUCCESS
        broker.close()
        if host == "::":  # the IPv6 wildcard takes IPv4 clients too (a dual-stack socket)
            await mqtt_roundtrip("127.0.0.1", port_of(gw, "mqtt"), "v4-on-v6")
    finally:
        await gw.stop()


async def test_store_link_over_ipv6(data_dir: Path, tmp_path: Path) -> None:
    store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="[::1]:0",
                           remoting_bind="[::1]:0"))
    await store.start()
    try:
        store_port = port_of(store, "remoting")
        remote = await RemoteStore.connect("::1", store_port)
        assert await remote.max_offset("t:a") == 0
        await remote.close()
        node = Gateway(Config(data_dir=tmp_path / "node", role="gateway", store_address=f"[::1]:{store_port}",
                              mqtt_bind="[::1]:0", amqp_bind="[::1]:0", remoting_bind="", node_id="g1"))
        await node.start()
        try:
            assert node.not_ready() is None
            await mqtt_roundtrip("::1", port_of(node, "mqtt"), "on-node")
            await asyncio.to_thread(amqp_roundtrip, "::1", port_of(node, "amqp"))  # relayed to the store node
        finally:
            await node.stop()
    finally:
        await store.stop()


async def test_localhost_without_ipv6_starts_on_ipv4_with_a_warning(data_dir: Path, monkeypatch, caplog) -> None:
    real_socket = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")  # EAFNOSUPPORT
        return real_socket(family, *args, **kwargs)

    monkeypatch.setattr(listen.socket, "socket", no_ipv6)
    caplog.set_level(logging.WARNING, "tidemq")
    gw = Gateway(Config(data_dir=data_dir, mqtt_bind="localhost:0", amqp_bind="", remoting_bind=""))
    await gw.start()
    try:
        port = port_of(gw, "mqtt")
        assert ports(gw, "mqtt") == {("127.0.0.1", port)}
        assert any("IPv6" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        monkeypatch.undo()
        await mqtt_roundtrip("127.0.0.1", port, "v4-only")
    finally:
        await gw.stop()
    # an address asked for by name is not skipped: no IPv6, no [::1] listener
    monkeypatch.setattr(listen.socket, "socket", no_ipv6)
    gw = Gateway(Config(data_dir=data_dir, mqtt_bind="[::1]:0", amqp_bind="", remoting_bind=""))
    with pytest.raises(OSError):
        await gw.start()
