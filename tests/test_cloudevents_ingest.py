"""CloudEvents in over HTTP (gateway/http/event_ingest.py, protocols/cloudevents): the CloudEvents
SDK's HTTP messages -- binary, structured and a batch -- posted with aiohttp to
``/data/events/{topic}``, seen by an MQTT 5.0 subscriber (the attributes as ``ce-`` user
properties) and by a rule, whose webhook gets each event with its own attributes; malformed
events refused with a 400 and nothing of their request stored; credentials and the ACL as for
the rest of ``/data/``; MQTT and AMQP publishers that send the ``ce-`` properties themselves."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import aio_pika
import aiohttp
from cloudevents.core.bindings.http import to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from gateway.auth import PasswordFile

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .rules_support import Webhook, call
from .test_rules import admin_url, amqp_url

CREATED = "com.example.order.created"


def order(n: int, kind: str = CREATED, **extra: str) -> CloudEvent:
    return CloudEvent(attributes={"type": kind, "source": "/shop/berlin", "subject": f"order-{n}",
                                  "datacontenttype": "application/json", **extra}, data={"n": n, "total": 10 * n})


def batch(*events: CloudEvent) -> bytes:
    """A batch in the JSON format (the SDK writes single events only)."""
    return b"[" + b",".join(JSONFormat().write(event) for event in events) + b"]"


async def post(base: str, topic: str, body: bytes, headers: dict[str, str], user: str = "",
               password: str = "") -> tuple[int, dict]:
    if user:
        headers = {**headers, "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/data/events/{topic}", data=body, headers=headers) as response:
            return response.status, await response.json()


async def test_binary_structured_and_batched_events_reach_an_mqtt_subscriber_and_a_rule(data_dir: Path) -> None:
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        status, row = await call(base, "POST", "/admin/rules", {
            "name": "created", "sources": ["orders/#"], "pattern": {"type": [CREATED], "data": {"n": [{"exists": True}]}},
            "targets": [{"type": "webhook", "url": hook.url}]})
        assert status == 201, row
        app = PahoClient(mqtt_port(gw), "app", version=5)
        await app.connect()
        await app.subscribe("orders/#", qos=1)
        events = [order(1, tenant="acme"), order(2), order(3), order(4, "com.example.order.cancelled")]
        binary = to_binary(events[0], JSONFormat())
        assert "ce-specversion" in binary.headers and "content-type" in binary.headers
        status, answer = await post(base, "orders/berlin", binary.body, binary.headers)
        assert status == 200, answer
        assert answer == {"topic": "orders/berlin", "stored": 1, "ids": [events[0].get_id()]}
        structured = to_structured(events[1], JSONFormat())
        status, answer = await post(base, "orders/berlin", structured.body, structured.headers)
        assert (status, answer["stored"]) == (200, 1), answer
        status, answer = await post(base, "orders/paris", batch(events[2], events[3]),
                                    {"Content-Type": "application/cloudevents-batch+json"})
        assert (status, answer["stored"], answer["ids"]) == (200, 2, [events[2].get_id(), events[3].get_id()])

        got = await app.receive(4)
        assert [m.topic for m in got] == ["orders/berlin", "orders/berlin", "orders/paris", "orders/paris"]
        assert [json.loads(m.payload) for m in got] == [{"n": n, "total": 10 * n} for n in range(1, 5)]
        first = dict(got[0].properties.UserProperty)
        assert first["ce-id"] == events[0].get_id() and first["ce-source"] == "/shop/berlin"
        assert first["ce-type"] == CREATED and first["ce-specversion"] == "1.0" and first["ce-tenant"] == "acme"
        assert first["ce-subject"] == "order-1" and first["ce-time"].startswith(str(events[0].get_time().year))
        assert got[0].properties.ContentType == "application/json"

        hits = await hook.wait_for(3)
        await asyncio.sleep(0.3)  # (the cancelled order does not match)
        assert len(hook.received) == 3
        assert [hit.headers["ce-id"] for hit in hits] == [e.get_id() for e in events[:3]]
        assert {hit.headers["ce-source"] for hit in hits} == {"/shop/berlin"}
        assert {hit.headers["ce-type"] for hit in hits} == {CREATED}
        assert [hit.headers["ce-subject"] for hit in hits] == ["order-1", "order-2", "order-3"]
        assert hits[0].headers["ce-tenant"] == "acme" and hits[0].headers["ce-topic"] == "orders/berlin"
        assert [hit.json()["n"] for hit in hits] == [1, 2, 3]
        await app.disconnect()
    await hook.down()


MALFORMED = [
    # (what, content type, extra headers, body, the reason's words)
    ("binary without source", "application/json",
     {"ce-specversion": "1.0", "ce-id": "1", "ce-type": CREATED}, b"{}", "required attribute source is missing"),
    ("no CloudEvent at all", "application/json", {}, b"{}", "no ce-specversion header"),
    ("structured without id", "application/cloudevents+json", {},
     json.dumps({"specversion": "1.0", "source": "/s", "type": CREATED}).encode(), "required attribute id"),
    ("an old specversion", "application/cloudevents+json", {},
     json.dumps({"specversion": "0.3", "id": "1", "source": "/s", "type": CREATED}).encode(), "specversion '0.3'"),
    ("a time that is not RFC 3339", "application/cloudevents+json", {},
     json.dumps({"specversion": "1.0", "id": "1", "source": "/s", "type": CREATED, "time": "yesterday"}).encode(),
     "not an RFC 3339 timestamp"),
    ("data and data_base64", "application/cloudevents+json", {},
     json.dumps({"specversion": "1.0", "id": "1", "source": "/s", "type": CREATED, "data": 1,
                 "data_base64": "AA=="}).encode(), "not both"),
    ("an upper-case attribute name", "application/cloudevents+json", {},
     json.dumps({"specversion": "1.0", "id": "1", "source": "/s", "type": CREATED, "Tenant": "x"}).encode(),
     "lower-case letters"),
    ("not JSON", "application/cloudevents+json", {}, b"{nope", "not JSON"),
    ("a batch with one bad event", "application/cloudevents-batch+json", {},
     json.dumps([{"specversion": "1.0", "id": "1", "source": "/s", "type": CREATED},
                 {"specversion": "1.0", "id": "2", "type": CREATED}]).encode(), "event [1] of the batch"),
    ("a batch that is no array", "application/cloudevents-batch+json", {}, b"{}", "a JSON array"),
    ("a lone surrogate in an attribute", "application/cloudevents+json", {},
     json.dumps({"specversion": "1.0", "id": "\ud800", "source": "/s", "type": CREATED}).encode(), "not UTF-8"),
    ("a lone surrogate in the data", "application/cloudevents+json", {},
     json.dumps({"specversion": "1.0", "id": "1", "source": "/s", "type": CREATED, "data": {"a": "\udfff"}}).encode(),
     "not UTF-8"),
    ("a format not read here", "application/cloudevents+avro", {}, b"\x00", "not read here"),
]


async def test_malformed_events_are_refused_and_nothing_of_their_request_is_stored(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        base = admin_url(gw)
        app = PahoClient(mqtt_port(gw), "app", version=5)
        await app.connect()
        await app.subscribe("orders/#", qos=1)
        for what, content_type, headers, body, words in MALFORMED:
            status, answer = await post(base, "orders/x", body, {"Content-Type": content_type, **headers})
            assert status == 400 and words in answer["error"], (what, answer)
        # a header of bytes that are not UTF-8 (what aiohttp's client would not send): over a raw socket
        reader, writer = await asyncio.open_connection(*gw.metrics_address)
        writer.write(b"POST /data/events/orders/x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Length: 1\r\n"
                     b"ce-specversion: 1.0\r\nce-id: 1\r\nce-type: t\r\nce-source: /a\xff\r\n\r\nx")
        answer_bytes = await reader.read()
        writer.close()
        assert answer_bytes.startswith(b"HTTP/1.1 400 ") and b"not UTF-8" in answer_bytes, answer_bytes
        status, answer = await post(base, "$SYS/x", *_good())
        assert status == 400 and "reserved" in answer["error"], answer
        status, answer = await post(base, "orders/%2B", *_good())  # "orders/+": no topic name
        assert status == 400 and "not a topic name" in answer["error"], answer
        # binary data with base64 in structured mode, then the one message that was stored
        status, answer = await post(base, "orders/x", json.dumps({
            "specversion": "1.0", "id": "last", "source": "/s", "type": CREATED, "datacontenttype": "image/png",
            "data_base64": base64.b64encode(b"\x89PNG").decode()}).encode(),
            {"Content-Type": "application/cloudevents+json"})
        assert status == 200, answer
        [message] = await app.receive(1)
        assert message.payload == b"\x89PNG" and message.properties.ContentType == "image/png"
        assert dict(message.properties.UserProperty)["ce-id"] == "last"
        await asyncio.sleep(0.2)
        assert app.messages.empty()
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/metrics") as response:
                metrics = await response.text()
        assert 'tidemq_cloudevents_total{result="stored"} 1.0' in metrics
        assert f'tidemq_cloudevents_total{{result="malformed"}} {float(len(MALFORMED) + 1)}' in metrics
        await app.disconnect()


def _good() -> tuple[bytes, dict[str, str]]:
    message = to_structured(order(1), JSONFormat())
    return message.body, message.headers


ACL = """
user alice
topic readwrite orders/#

user bob
topic read orders/#
"""


async def test_events_need_credentials_and_the_publish_right_on_their_topic(data_dir: Path, tmp_path: Path) -> None:
    users = PasswordFile()
    for name in ("alice", "bob"):
        users.set(name, "pw-" + name, iterations=1000)
    users.save(tmp_path / "passwd")
    (tmp_path / "acl").write_text(ACL)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", password_file=str(tmp_path / "passwd"),
                               acl_file=str(tmp_path / "acl"), allow_anonymous=False) as gw:
        base = admin_url(gw)
        status, answer = await post(base, "orders/x", *_good())
        assert status == 401, answer
        status, answer = await post(base, "orders/x", *_good(), user="alice", password="wrong")
        assert status == 401, answer
        status, answer = await post(base, "orders/x", *_good(), user="bob", password="pw-bob")
        assert status == 403 and "orders/x" in answer["error"], answer
        status, answer = await post(base, "orders/x", *_good(), user="alice", password="pw-alice")
        assert (status, answer["stored"]) == (200, 1), answer
        assert gw.store.max_offset_now("t:orders/x") == 1  # (bob's was not stored)


async def test_an_event_larger_than_a_request_may_be_is_refused(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, answer = await post(admin_url(gw), "orders/x", b"x" * (5 << 20),
                                    {"ce-specversion": "1.0", "ce-id": "big", "ce-source": "/s", "ce-type": CREATED,
                                     "Content-Type": "application/octet-stream"})
        assert status == 413 and "bytes" in answer["error"], answer
        assert gw.store.max_offset_now("t:orders/x") == 0


async def test_mqtt_and_amqp_publishers_sending_ce_properties_are_seen_by_a_rule_as_their_cloudevents(
        data_dir: Path) -> None:
    """The binary mapping read back on every protocol's path: an MQTT 5.0 publish with ``ce-``
    user properties and an AMQP publish with ``ce-`` headers reach a webhook with their own id,
    source, type and extensions; a partial set (no ce-type) is a plain message."""
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", amqp_bind="127.0.0.1:0") as gw:
        status, row = await call(admin_url(gw), "POST", "/admin/rules", {
            "name": "bus", "sources": ["bus/#"], "targets": [{"type": "webhook", "url": hook.url}]})
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "dev", version=5)
        await device.connect()
        properties = PahoProperties(PacketTypes.PUBLISH)
        properties.UserProperty = [("ce-specversion", "1.0"), ("ce-id", "m-1"), ("ce-source", "/devices/d1"),
                                   ("ce-type", CREATED), ("ce-site", "berlin")]
        await device.publish("bus/a", json.dumps({"n": 1}), 1, properties=properties)
        conn = await aio_pika.connect(amqp_url(gw))
        exchange = await (await conn.channel()).get_exchange("amq.topic")
        await exchange.publish(aio_pika.Message(b'{"n": 2}', content_type="application/json", headers={
            "ce-specversion": "1.0", "ce-id": "a-1", "ce-source": "/apps/billing", "ce-type": CREATED,
            "ce-subject": "invoice-7"}), "bus.b")
        partial = PahoProperties(PacketTypes.PUBLISH)
        partial.UserProperty = [("ce-specversion", "1.0"), ("ce-id", "p-1"), ("ce-source", "/x")]
        await device.publish("bus/c", json.dumps({"n": 3}), 1, properties=partial)
        first, second, third = await hook.wait_for(3)
        assert (first.headers["ce-id"], first.headers["ce-source"], first.headers["ce-type"]) == (
            "m-1", "/devices/d1", CREATED)
        assert first.headers["ce-site"] == "berlin" and "ce-subject" not in first.headers
        assert first.headers["ce-protocol"] == "mqtt" and first.headers["ce-topic"] == "bus/a"
        assert (second.headers["ce-id"], second.headers["ce-source"], second.headers["ce-subject"]) == (
            "a-1", "/apps/billing", "invoice-7")
        assert second.headers["ce-protocol"] == "amqp"
        assert third.headers["ce-id"] != "p-1" and third.headers["ce-type"] == "tidemq.mqtt.message"
        assert third.headers["ce-source"] == "/mqtt/clients/dev"
        await device.disconnect()
        await conn.close()
    await hook.down()
