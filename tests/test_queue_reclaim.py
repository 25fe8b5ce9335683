"""Light queues removed when idle and unread, and per-topic retention, through real clients
(paho, pika): what nobody reads goes, what a subscription, a persistent session or a declared
AMQP queue reads stays, a topic used again works from scratch, and a command topic's messages
expire for an offline session while telemetry beside them is kept."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pika
import pytest

from gateway.config import ConfigError, load_config
from gateway.queue_policy import QueuePolicy, parse_rules

from protocols.mqtt.packets import MQTT_3_1_1, Connect, Publish, Subscribe, Subscription

from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway
from .remoting_support import ons, remoting_gateway

IDLE = dict(queue_idle_ttl_hours=1 / 3600, queue_idle_check_interval_s=0.3)  # idle after 1 s


async def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_idle_unread_topics_go_and_read_ones_stay(data_dir: Path) -> None:
    async with running_gateway(data_dir, **IDLE) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub")
        await sub.connect()
        await sub.subscribe("live/topic", qos=1)
        await sub.subscribe("wild/+", qos=1)
        offline = PahoClient(port, "offline", clean=False)
        await offline.connect()
        await offline.subscribe("kept/for/session", qos=1)
        await offline.disconnect()
        pub = PahoClient(port, "pub")
        await pub.connect()
        for topic in ("gone/topic", "live/topic", "wild/a", "kept/for/session"):
            await pub.publish(topic, topic.encode(), qos=1)
        assert len(await sub.receive(2)) == 2
        index = gw.store.index
        await wait_until(lambda: index.lookup("t:gone/topic") is None and index.lookup("t:wild/a") is None)
        # (t:wild/a goes: subscribers of wild/+ read its wildcard queue w:wild/+)
        for read in ("t:live/topic", "w:wild/+", "t:kept/for/session"):
            assert index.lookup(read) is not None, read

        # the persistent session gets what came while it was away; the removed topic works again
        offline = PahoClient(port, "offline", clean=False)
        await offline.connect()
        assert [m.payload for m in await offline.receive(1)] == [b"kept/for/session"]
        again = PahoClient(port, "again")
        await again.connect()
        await again.subscribe("gone/topic", qos=1)
        await pub.publish("gone/topic", b"back", qos=1)
        assert [m.payload for m in await again.receive(1)] == [b"back"]
        assert gw.store.max_offset_now("t:gone/topic") == 1  # a new queue: offsets from 0
        for client in (sub, offline, again, pub):
            await client.disconnect()


async def test_a_retained_message_outlives_its_removed_topic_queue(data_dir: Path) -> None:
    async with running_gateway(data_dir, **IDLE) as gw:
        port = mqtt_port(gw)
        pub = PahoClient(port, "pub")
        await pub.connect()
        await pub.publish("status/dev1", b"online", qos=1, retain=True)
        await pub.disconnect()
        await wait_until(lambda: gw.store.index.lookup("t:status/dev1") is None)
        sub = PahoClient(port, "sub")
        await sub.connect()
        await sub.subscribe("status/+", qos=1)
        (message,) = await sub.receive(1)
        assert (message.payload, message.retain) == (b"online", True)
        await sub.disconnect()


async def test_topics_a_spark_query_holds_are_read(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", **IDLE) as gw:
        url = "http://{}:{}/data/filters".format(*gw.metrics_address)
        async with aiohttp.ClientSession() as http:
            for topic_filter in ("fleet/+/status", "plant/7/power"):  # a wildcard and a concrete filter
                async with http.post(url, json={"topicFilter": topic_filter, "lease_ms": 600_000}) as response:
                    assert response.status == 200
        pub = PahoClient(mqtt_port(gw), "pub")
        await pub.connect()
        for topic in ("fleet/a/status", "plant/7/power", "other/x"):
            await pub.publish(topic, b"m", qos=1)
        await pub.disconnect()
        await wait_until(lambda: gw.store.index.lookup("t:other/x") is None)
        for held in ("t:fleet/a/status", "w:fleet/+/status", "t:plant/7/power"):
            assert gw.store.index.lookup(held) is not None, held
        async with aiohttp.ClientSession() as http, http.get(url.replace("/data/filters", "/metrics")) as response:
            metrics = await response.text()
        (line,) = [x for x in metrics.splitlines() if x.startswith("tidemq_queues_reclaimed_total ")]
        assert float(line.split()[1]) >= 1


def _amqp(port: int, work) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        work(connection.channel())
    finally:
        connection.close()


async def test_declared_amqp_queues_stay_and_deleted_ones_go(data_dir: Path) -> None:
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0", **IDLE) as gw:
        port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")

        def declare_publish_delete(channel) -> None:
            channel.confirm_delivery()
            for name in ("orders", "scratch"):
                channel.queue_declare(name, durable=True)
                channel.basic_publish("", name, name.encode(), pika.BasicProperties(delivery_mode=2))
            channel.queue_delete("scratch")

        await asyncio.to_thread(_amqp, port, declare_publish_delete)
        await wait_until(lambda: gw.store.index.lookup("q:scratch") is None)
        assert gw.store.index.lookup("q:orders") is not None

        def get_one(channel) -> None:
            method, _, body = channel.basic_get("orders", auto_ack=True)
            assert body == b"orders"
            # the deleted queue's name declared again: a new, empty queue that works
            assert channel.queue_declare("scratch", durable=True).method.message_count == 0
            channel.confirm_delivery()
            channel.basic_publish("", "scratch", b"new", pika.BasicProperties(delivery_mode=2))
            assert channel.basic_get("scratch", auto_ack=True)[2] == b"new"

        await asyncio.to_thread(_amqp, port, get_one)


async def test_a_command_topic_expires_for_an_offline_session_while_telemetry_is_kept(data_dir: Path) -> None:
    rules = '{"cmd/#": {"hours": 0.0003}}'  # ~1 s
    async with running_gateway(data_dir, retention_topics=rules, retention_check_interval_s=0.3) as gw:
        port = mqtt_port(gw)
        device = PahoClient(port, "device", clean=False)
        await device.connect()
        await device.subscribe("cmd/dev1", qos=1)
        await device.subscribe("tele/dev1", qos=1)
        await device.disconnect()
        pub = PahoClient(port, "pub")
        await pub.connect()
        await pub.publish("cmd/dev1", b"stale command", qos=1)
        await pub.publish("tele/dev1", b"reading", qos=1)
        await wait_until(lambda: gw.store.min_offset_now("t:cmd/dev1") == 1)
        await pub.publish("cmd/dev1", b"fresh command", qos=1)
        device = PahoClient(port, "device", clean=False)
        await device.connect()
        got = sorted(m.payload for m in await device.receive(2))
        assert got == [b"fresh command", b"reading"]
        await device.nothing_more()
        for client in (device, pub):
            await client.disconnect()


def test_per_topic_rules_come_from_a_toml_table_or_json_and_bad_ones_are_named(tmp_path: Path) -> None:
    toml = tmp_path / "tidemq.toml"
    toml.write_text('[retention]\nhours = 24\n[retention.topics]\n"devices/+/telemetry" = { hours = 2160 }\n'
                    '"devices/+/commands" = { hours = 6, bytes = 1000000 }\n"alerts/#" = 48\n')
    cfg = load_config(toml, env={})
    rules = parse_rules(cfg.retention_topics)
    assert [(r.topic_filter, r.hours, r.bytes) for r in rules] == [
        ("devices/+/telemetry", 2160.0, 0), ("devices/+/commands", 6.0, 1_000_000), ("alerts/#", 48.0, 0)]
    policy = QueuePolicy(rules, 24.0, ("t:",))
    assert policy.retention("t:devices/7/commands") == (6.0, 1_000_000)
    assert policy.retention("t:devices/7/status") is None and policy.retention("q:devices/7/commands") is None
    assert policy.longest_hours == 2160.0
    assert policy.idle_ttl_s("t:devices/7/telemetry") == 2160 * 3600.0  # kept as long as its rule keeps data
    assert policy.idle_ttl_s("t:other") == 24 * 3600.0 and policy.idle_ttl_s("r:Topic:0") == 0.0
    assert load_config(env={"TIDEMQ_RETENTION_TOPICS": '{"a/#": 1}'}).retention_topics == '{"a/#": 1}'
    for bad, words in (('{"a/#": {"hours": -1}}', "hours is a number"), ('{"a/#x": 1}', "not a topic filter"),
                       ('{"a": {"days": 3}}', "give hours"), ('{"a": {"hours": 0}}', "needs hours or bytes"),
                       ("[1]", "JSON object")):
        with pytest.raises(ConfigError, match=words):
            load_config(env={"TIDEMQ_RETENTION_TOPICS": bad})


async def test_a_shared_group_kept_for_an_unacknowledged_delivery_is_a_reader(data_dir: Path) -> None:
    """Its last member left without acknowledging: the group (and its cursor) stays; its queue
    must too, or the group would read on at its old offset in a new queue of that name."""
    async with running_gateway(data_dir, **IDLE) as gw:
        port = mqtt_port(gw)
        pub = PahoClient(port, "pub")
        await pub.connect()
        worker, _ = await RawClient.connected(port, Connect("w1", MQTT_3_1_1))
        worker.send(Subscribe(1, [Subscription("$share/g/cmd/x", 1)]))
        await worker.recv()  # SUBACK
        await pub.publish("cmd/x", b"old", qos=1)
        assert isinstance(await worker.recv(), Publish)  # never acknowledged
        await worker.close()
        await pub.publish("other/topic", b"x", qos=1)
        await wait_until(lambda: gw.store.index.lookup("t:other/topic") is None)  # (a scan, and more, passed)
        assert gw.store.index.lookup("t:cmd/x") is not None and gw.mqtt.share_groups
        for i in range(3):
            await pub.publish("cmd/x", f"new{i}".encode(), qos=1)
        second = PahoClient(port, "w2")
        await second.connect()
        await second.subscribe("$share/g/cmd/x", qos=1)
        assert sorted(m.payload for m in await second.receive(4)) == [b"new0", b"new1", b"new2", b"old"]
        for client in (pub, second):
            await client.disconnect()


async def test_a_running_spark_stream_reads_its_topics_until_its_lease_lapses(data_dir: Path) -> None:
    from bridge.data_client import close_clients
    from bridge.spark_options import SourceOptions
    from bridge.spark_source import TideMQStreamReader

    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", **IDLE) as gw:
        pub = PahoClient(mqtt_port(gw), "pub")
        await pub.connect()
        for topic in ("fleet/a/status", "other/x"):
            await pub.publish(topic, b"m", qos=1)
        address = "{}:{}".format(*gw.metrics_address)
        reader = TideMQStreamReader(SourceOptions.parse(
            {"address": address, "topicFilter": "fleet/+/status", "filterLeaseMs": "1500"}))
        try:
            start = await asyncio.to_thread(reader.initialOffset)
            assert start == {"t:fleet/a/status": 1}
            await wait_until(lambda: gw.store.index.lookup("t:other/x") is None)
            assert gw.store.index.lookup("t:fleet/a/status") is not None  # read by the stream
            assert gw.store.index.lookup("w:fleet/+/status") is None  # (a reader: no wildcard queue)
        finally:
            reader.stop()
            close_clients()
        await wait_until(lambda: gw.store.index.lookup("t:fleet/a/status") is None)  # lapsed, then idle
        await pub.disconnect()


async def test_remoting_topics_are_not_light_and_stay_when_idle(data_dir: Path) -> None:
    """A remoting topic is a normal RocketMQ topic: created on first use, it persists (as
    RocketMQ's auto-created topics do) however long nobody reads it; the same idle time
    removes an unread MQTT topic beside it."""
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0", **IDLE) as (gw, addr):
        sent = await ons({"cmd": "send", "nameSrv": addr, "topic": "Orders", "messages": [{"body": "kept"}]})
        queue = f"r:Orders:{sent[0]['queueId']}"
        pub = PahoClient(mqtt_port(gw), "pub")
        await pub.connect()
        await pub.publish("unread/topic", b"goes", qos=1)
        await pub.disconnect()
        index = gw.store.index
        await wait_until(lambda: index.lookup("t:unread/topic") is None)  # idle and unread: reclaimed
        await asyncio.sleep(2 * IDLE["queue_idle_check_interval_s"])  # (and more scans)
        assert index.lookup(queue) is not None and gw.store.max_offset_now(queue) == 1
        got = await ons({"cmd": "consume", "nameSrv": addr, "group": "late", "topic": "Orders", "count": 1,
                         "timeoutMs": 20_000, "fromFirst": True})
        assert [e["body"] for e in got if e["event"] == "message"] == ["kept"]
