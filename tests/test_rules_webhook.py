"""The webhook target's HTTP/1.1 connection through real clients: an MQTT publisher's events
POSTed to a real aiohttp server answering in each framing HTTP/1.1 has, to a server that closes
a kept-alive connection instead of answering, and an event whose content type would break the
request."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

import pytest

from aiohttp import web
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from protocols.mqtt.packets import MQTT_5

from .mosquitto_support import self_signed_certificate
from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .rules_support import call, until
from .test_rules import admin_url


class FramingServer:
    """An aiohttp server answering the events by ``n % 4``: a long body with a Content-Length, a
    chunked body, 204 with ``Connection: close``, 202 with an empty body."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.headers: list[dict[str, str]] = []
        self.connections: set[int] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def up(self, tls: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        app.router.add_post("/events", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=tls).start()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self._runner.addresses[0][1]}/events"

    async def down(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        n = json.loads(await request.read())["n"]
        self.received.append(n)
        self.connections.add(id(request.transport))
        if n % 4 == 0:
            return web.Response(status=200, body=b"x" * 200_000)
        if n % 4 == 1:
            response = web.StreamResponse(status=200)
            response.enable_chunked_encoding()
            await response.prepare(request)
            for part in (b"a", b"b" * 70_000, b"c"):
                await response.write(part)
            await response.write_eof()
            return response
        if n % 4 == 2:
            response = web.Response(status=204)
            response.force_close()
            return response
        return web.Response(status=202)


async def test_answers_in_every_framing_are_read_and_the_next_event_goes_on(data_dir: Path) -> None:
    server = FramingServer()
    await server.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "framing", "sources": ["meters/#"], "targets": [{"type": "webhook", "url": server.url}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        for n in range(20):
            await device.publish("meters/m1", json.dumps({"n": n}), 1)
        await until(lambda: gw.rules.engine.get("framing")["delivered"] == 20, what="20 deliveries")
        assert server.received == list(range(20))  # (each once, in order)
        row = gw.rules.engine.get("framing")
        assert (row["retried"], row["dead_lettered"], row["lag"]) == (0, 0, 0)
        assert len(server.connections) >= 5  # (a new connection after each 'Connection: close')
        await device.disconnect()
    await server.down()


async def test_a_kept_alive_connection_the_server_closed_unanswered_is_sent_again_at_once(data_dir: Path) -> None:
    """A server that closes a connection when a second request comes on it (as one does whose
    idle timeout ends as the request arrives): the event goes again on a new connection, with no
    retry wait; nothing lost, in order of first arrival."""
    seen: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            seen.append(json.loads(await reader.readexactly(length))["n"])
            if answered:
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            answered += 1

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "closing", "sources": ["meters/#"], "retry": {"initial_backoff_ms": 60_000, "max_backoff_ms": 60_000},
            "targets": [{"type": "webhook", "url": f"http://127.0.0.1:{port}/events"}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        for n in range(5):
            await device.publish("meters/m1", json.dumps({"n": n}), 1)
            await until(lambda: gw.rules.engine.get("closing")["delivered"] == n + 1, timeout_s=10,
                        what=f"event {n} delivered without a retry's wait")
        assert list(dict.fromkeys(seen)) == list(range(5))
        assert gw.rules.engine.get("closing")["retried"] == 0
        await device.disconnect()
    server.close()


async def test_a_content_type_with_a_line_break_goes_to_the_dead_letter_topic_and_adds_no_header(
        data_dir: Path) -> None:
    server = FramingServer()
    await server.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "typed", "sources": ["meters/#"], "targets": [{"type": "webhook", "url": server.url}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "meter", version=MQTT_5)
        await device.connect()
        bad = PahoProperties(PacketTypes.PUBLISH)
        bad.ContentType = "text/plain\r\nX-Injected: 1"
        await device.publish("meters/m1", json.dumps({"n": 3}), 1, properties=bad)
        await device.publish("meters/m1", json.dumps({"n": 7}), 1)
        await until(lambda: gw.rules.engine.get("typed")["delivered"] == 1, what="the next event delivered")
        row = gw.rules.engine.get("typed")
        assert row["dead_lettered"] == 1, row
        assert server.received == [7] and all("X-Injected" not in h for h in server.headers)
        await device.disconnect()
    await server.down()


async def test_an_https_webhook_is_delivered_to_only_when_its_certificate_is_trusted(
        data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    certificate, key = self_signed_certificate(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(certificate, key)
    server = FramingServer()
    await server.up(tls)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, row = await call(base, "POST", "/admin/rules", {
            "name": "untrusted", "sources": ["meters/#"], "targets": [{"type": "webhook", "url": server.url}]})
        assert status == 201, row
        monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # (the authorities a target made from now on trusts)
        status, row = await call(base, "POST", "/admin/rules", {
            "name": "trusted", "sources": ["meters/#"], "targets": [{"type": "webhook", "url": server.url}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        await device.publish("meters/m1", json.dumps({"n": 3}), 1)
        await until(lambda: gw.rules.engine.get("trusted")["delivered"] == 1, what="the trusted rule's delivery")
        await until(lambda: "CERTIFICATE_VERIFY_FAILED" in (gw.rules.engine.get("untrusted")["last_error"] or ""),
                    what="the untrusted rule's certificate error")
        assert server.received == [3]
        row = gw.rules.engine.get("untrusted")
        assert (row["delivered"], row["dead_lettered"], row["lag"]) == (0, 0, 1)  # (retried: it waits in the store)
        await device.disconnect()
    await server.down()


async def test_the_batched_mode_posts_arrays_of_events_in_order_and_a_failed_request_again(data_dir: Path) -> None:
    batches: list[list[int]] = []
    answers: list[int] = []  # statuses to answer before 200

    async def handle(request: web.Request) -> web.Response:
        assert request.content_type == "application/cloudevents-batch+json"
        documents = json.loads(await request.read())
        assert all(d["specversion"] == "1.0" and d["source"] == "/mqtt/clients/meter" for d in documents)
        status = answers.pop() if answers else 200
        if status == 200:
            batches.append([d["data"]["n"] for d in documents])
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/events", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/events"
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, answer = await call(base, "POST", "/admin/rules", {
            "name": "bad", "sources": ["meters/#"], "targets": [{"type": "webhook", "url": url, "batch_size": 8}]})
        assert (status, answer["path"]) == (400, "$.targets[0].batch_size"), answer
        status, row = await call(base, "POST", "/admin/rules", {
            "name": "batched", "sources": ["meters/#"], "paused": True, "retry": {"initial_backoff_ms": 20},
            "targets": [{"type": "webhook", "url": url, "mode": "batched", "batch_size": 8}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        for n in range(30):
            await device.publish("meters/m1", json.dumps({"n": n}), 1)
        await call(base, "POST", "/admin/rules/batched/resume")
        await until(lambda: gw.rules.engine.get("batched")["delivered"] == 30, what="30 deliveries")
        assert [n for batch in batches for n in batch] == list(range(30))
        assert max(len(batch) for batch in batches) == 8
        answers.append(503)  # (a failed request: its events are sent again before any after them)
        for n in range(30, 35):
            await device.publish("meters/m1", json.dumps({"n": n}), 1)
        await until(lambda: gw.rules.engine.get("batched")["delivered"] == 35, what="35 deliveries")
        assert [n for batch in batches for n in batch] == list(range(35))
        row = gw.rules.engine.get("batched")
        assert (row["dead_lettered"], row["lag"], row["retried"]) == (0, 0, 1)
        await device.disconnect()
    await runner.cleanup()
