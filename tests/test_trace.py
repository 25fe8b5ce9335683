"""Message trace through real clients: an MQTT 5 publish read by an AMQP consumer shows
publish, store, deliver and ack in time order, found by message id and by key, also after a
restart; listeners without trace record nothing; ``tidemq ctl trace`` prints it."""

from __future__ import annotations

import asyncio
import json
import pickle
import urllib.request
from pathlib import Path

import aio_pika
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from gateway.trace import TRACE_QUEUE, TRACE_TOPIC, parse_listeners, rows_of, trace_of
from protocols.mqtt.packets import MQTT_5
from store import Message

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .test_bridge_mqtt_amqp import amqp_url
from .test_ctl import ctl


def admin_get(gw, path: str):
    host, port = gw.metrics_address
    url = f"http://{host}:{port}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


async def trace_until(gw, path: str, types: set[str], timeout_s: float = 10.0) -> list[dict]:
    """The trace events, once every type in ``types`` is there (trace is written in batches)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        events = (await asyncio.to_thread(admin_get, gw, path))["events"]
        if types <= {e["type"] for e in events} or asyncio.get_running_loop().time() > deadline:
            return events
        await asyncio.sleep(0.1)


def keyed(key: str) -> PahoProperties:
    props = PahoProperties(PacketTypes.PUBLISH)
    props.UserProperty = ("key", key)
    return props


async def publish_to_amqp_consumer(gw, key: str) -> aio_pika.abc.AbstractIncomingMessage:
    conn = await aio_pika.connect(amqp_url(gw))
    try:
        ch = await conn.channel()
        queue = await ch.declare_queue("alerts")
        await queue.bind("amq.topic", "plant.*.alarm")
        device = PahoClient(mqtt_port(gw), "press-7", version=MQTT_5)
        await device.connect()
        await device.publish("plant/press7/alarm", b"over pressure", qos=1, properties=keyed(key))
        await device.disconnect()
        async with queue.iterator() as messages:
            async for message in messages:
                await message.ack()
                return message
    finally:
        await conn.close()
    raise AssertionError("no message")


async def test_mqtt_to_amqp_trace_by_id_and_key_survives_restart(data_dir: Path) -> None:
    settings = {"amqp_bind": "127.0.0.1:0", "metrics_bind": "127.0.0.1:0", "trace": "mqtt,amqp"}
    async with running_gateway(data_dir, **settings) as gw:
        message = await publish_to_amqp_consumer(gw, "batch-42")
        assert message.body == b"over pressure"
        events = await trace_until(gw, "/admin/trace?key=batch-42", {"publish", "store", "deliver", "ack"})
        types = [e["type"] for e in events]
        # (the delivery may go out before the put's acknowledgement is recorded: both follow the commit)
        assert (types[0], sorted(types[1:3]), types[3:]) == ("publish", ["deliver", "store"], ["ack"]), types
        times = [e["time"] for e in events]
        assert times == sorted(times)
        publish, ack = events[0], events[3]
        store, deliver = sorted(events[1:3], key=lambda e: e["type"] != "store")
        msg_id = publish["msg_id"]
        assert {e["msg_id"] for e in events} == {msg_id}
        assert (publish["protocol"], publish["client"], publish["topic"], publish["size"], publish["keys"]) == (
            "mqtt", "press-7", "plant/press7/alarm", len(b"over pressure"), "batch-42")
        assert set(store["queues"]) == {"t:plant/press7/alarm", "q:alerts"} and store["cost_ms"] >= 0
        assert (deliver["protocol"], deliver["queue"], deliver["offset"], deliver["qos"]) == ("amqp", "q:alerts", 0, 1)
        assert (ack["protocol"], ack["client"]) == ("amqp", deliver["client"])
        by_id = (await asyncio.to_thread(admin_get, gw, f"/admin/trace?msg_id={msg_id}"))["events"]
        assert by_id == events
        # the store's message query gives the same message for the id
        found = await asyncio.to_thread(admin_get, gw, f"/admin/messages?msg_id={msg_id}")
        assert found[0]["body"] == "over pressure"

    async with running_gateway(data_dir, **settings) as gw:  # after a restart
        found = await asyncio.to_thread(admin_get, gw, "/admin/messages?key=batch-42&topic=plant/press7/alarm")
        assert [m["msg_id"] for m in found] == [msg_id]
        after = (await asyncio.to_thread(admin_get, gw, f"/admin/trace?msg_id={msg_id}"))["events"]
        assert after == events
        url = "http://{}:{}".format(*gw.metrics_address)
        code, out, _ = await ctl(url, "trace", "--key", "batch-42", token="")
        lines = out.splitlines()
        assert code == 0 and [line.split()[0] for line in lines[1:]] == types


async def test_untraced_listener_records_nothing(data_dir: Path) -> None:
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0", metrics_bind="127.0.0.1:0", trace="amqp") as gw:
        await publish_to_amqp_consumer(gw, "quiet-1")
        events = await trace_until(gw, "/admin/trace?key=quiet-1", {"publish"}, timeout_s=1.0)
        assert events == []  # the MQTT publish is not traced, so the key names no trace
        await gw.tracer.flush()
        records = gw.store.get_now(TRACE_QUEUE, 0, 10).messages
        rows = [row for record in records for row in rows_of(record)]
        assert [row[0] for row in rows] == ["deliver", "ack"]  # the AMQP side is


def test_trace_listener_names() -> None:
    assert parse_listeners("") == frozenset()
    assert parse_listeners(" mqtt , amqp") == {"mqtt", "amqp"}
    assert parse_listeners("all") == {"mqtt", "mqtts", "ws", "amqp", "remoting"}
    try:
        parse_listeners("mqtt,smtp")
    except ValueError as exc:
        assert "smtp" in str(exc)
    else:
        raise AssertionError("an unknown listener name was accepted")


class _Boom:
    def __reduce__(self):
        return (print, ("unpickled code ran",))


async def test_trace_reads_only_plain_data_of_the_trace_queue(data_dir: Path, capsys) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", trace="mqtt") as gw:
        device = PahoClient(mqtt_port(gw), "spoofer", version=MQTT_5)
        await device.connect()
        await device.publish("real/topic", b"x", qos=1)
        await gw.tracer.flush()
        (position,) = {row[1] for record in gw.store.get_now(TRACE_QUEUE, 0, 10).messages
                       for row in rows_of(record)}
        msg_id = f"{gw.store.msg_id_prefix}{position:016X}"
        assert [e["type"] for e in trace_of(gw.store, msg_id)] == ["publish", "store"]
        # a client's message on a topic named like the trace topic, keyed by that position
        fake = pickle.dumps([("ack", position, 0.0, "mqtt", "intruder", "q", 0)])
        await device.publish(TRACE_TOPIC, fake, qos=1, properties=keyed(str(position)))
        # and a record of the trace queue that holds a class reference
        await gw.store.put(Message(TRACE_TOPIC, pickle.dumps([_Boom()]), key=str(position)), [TRACE_QUEUE])
        await device.disconnect()
        events = trace_of(gw.store, msg_id)
        assert [e["type"] for e in events] == ["publish", "store"]
        assert "unpickled code ran" not in capsys.readouterr().out
