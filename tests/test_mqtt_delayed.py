"""Delayed publish (``$delayed/{seconds}/{topic}``, as EMQX): acknowledged once stored, delivered
to ``topic``'s subscribers at its time, never early; kept across a kill -9; bad ones refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from protocols.mqtt.packets import MQTT_3_1_1, MQTT_5, Connect, PubAck, Publish

from .crash_support import free_port, kill9, start_gateway, stop
from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
async def test_a_delayed_publish_reaches_subscribers_at_its_time(data_dir: Path, version: int) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub", version=version)
        await sub.connect()
        await sub.subscribe("dev/+/cmd", qos=1)
        pub = PahoClient(port, "pub", version=version)
        await pub.connect()
        sent = time.monotonic()
        await pub.publish("$delayed/2/dev/7/cmd", b"reboot", qos=1)  # PUBACK: stored
        await pub.publish("dev/7/cmd", b"now", qos=1)
        (first,) = await sub.receive(1)
        assert (first.topic, first.payload) == ("dev/7/cmd", b"now")
        (later,) = await sub.receive(1, timeout=5)
        assert (later.topic, later.payload, later.qos) == ("dev/7/cmd", b"reboot", 1)
        assert time.monotonic() - sent >= 2.0
        await sub.nothing_more()
        await pub.disconnect()
        await sub.disconnect()


async def test_bad_delayed_publishes_are_refused_with_reason_codes(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        client, _ = await RawClient.connected(mqtt_port(gw), Connect("c", MQTT_5))
        # (a wildcard in any PUBLISH topic is a protocol error: DISCONNECT 0x90, like any other)
        cases = [("$delayed/soon/t", False, 0x90), ("$delayed/5", False, 0x90), ("$delayed/-1/t", False, 0x90),
                 ("$delayed/4294968/t", False, 0x90), ("$delayed/5/$SYS/x", False, 0x90),
                 ("$delayed/5/", False, 0x90), ("$delayed/5/t", True, 0x83)]
        for packet_id, (topic, retain, code) in enumerate(cases, 1):
            client.send(Publish(topic, b"x", 1, retain=retain, packet_id=packet_id))
            ack = await client.recv()
            assert isinstance(ack, PubAck) and (ack.packet_id, ack.reason_code) == (packet_id, code), topic
        assert gw.store.held.count(ord("T")) == 0
        await client.close()


async def test_the_acl_applies_to_the_delayed_topic(data_dir: Path, tmp_path: Path) -> None:
    acl = tmp_path / "acl.conf"
    acl.write_text("topic write open/#\n")
    async with running_gateway(data_dir, acl_file=acl) as gw:
        client, _ = await RawClient.connected(mqtt_port(gw), Connect("c", MQTT_5))
        client.send(Publish("$delayed/1/closed/t", b"x", 1, packet_id=1))
        assert (await client.recv()).reason_code == 0x87
        client.send(Publish("$delayed/1/open/t", b"x", 1, packet_id=2))
        assert (await client.recv()).reason_code == 0
        await client.close()


async def test_a_delayed_publish_survives_kill_9_right_after_its_puback(data_dir: Path) -> None:
    port = free_port()
    proc = start_gateway(data_dir, mqtt_port=port)
    try:
        sub = PahoClient(port, "keeper", version=MQTT_5, clean=False, session_expiry=600)
        await sub.connect()
        await sub.subscribe("late/t", qos=1)
        await sub.disconnect()
        pub = PahoClient(port, "pub")
        await pub.connect()
        published = time.monotonic()
        await pub.publish("$delayed/2/late/t", b"after the crash", qos=1)
        kill9(proc)
        await asyncio.to_thread(pub.client.loop_stop)
        proc = start_gateway(data_dir, mqtt_port=port)
        sub = PahoClient(port, "keeper", version=MQTT_5, clean=False, session_expiry=600)
        await sub.connect()
        (message,) = await sub.receive(1, timeout=10)
        assert message.payload == b"after the crash" and time.monotonic() - published >= 2.0
        await sub.nothing_more(1.0)  # exactly once
        await sub.disconnect()
    finally:
        stop(proc)


async def test_a_delayed_publish_on_a_gateway_node_waits_in_the_store_node(data_dir: Path) -> None:
    """The store link carries the message's hold: a gateway node's delayed publish is held by the
    store node's timer, not delivered at once."""
    from .test_cluster_mqtt import cluster

    async with cluster(data_dir) as (store, (a, b)):
        subscriber = PahoClient(mqtt_port(b), "sub")
        await subscriber.connect()
        await subscriber.subscribe("late/t", qos=1)
        publisher = PahoClient(mqtt_port(a), "pub")
        await publisher.connect()
        sent = time.monotonic()
        await publisher.publish("$delayed/1/late/t", b"held on the store node", qos=1)
        assert store.store.held.count(ord("T")) == 1
        (message,) = await subscriber.receive(1, timeout=10)
        assert message.payload == b"held on the store node" and time.monotonic() - sent >= 1.0
        await publisher.disconnect()
        await subscriber.disconnect()
