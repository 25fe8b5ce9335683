"""MQTT sessions through real clients: persistence across disconnects and gateway restarts,
clean start, expiry, takeover, wills, retained messages and keep alive."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from protocols.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from protocols.mqtt.properties import Properties

from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
async def test_persistent_session_gets_what_was_published_while_offline(data_dir: Path, version: int) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "dev1", version=version, clean=False, session_expiry=600)
        await sub.connect()
        await sub.subscribe("cmd/dev1/#", 1)
        await sub.disconnect()
        pub = PahoClient(port, "app")
        await pub.connect()
        for i in range(10):
            await pub.publish(f"cmd/dev1/{i}", f"c{i}", 1)
        sub = PahoClient(port, "dev1", version=version, clean=False, session_expiry=600)
        flags, _, _ = await sub.connect()
        assert flags.session_present
        got = await sub.receive(10)
        assert [m.payload for m in got] == [f"c{i}".encode() for i in range(10)]
        await sub.nothing_more(0.3)
        await sub.disconnect()
        await pub.disconnect()


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
async def test_persistent_session_survives_gateway_restart(data_dir: Path, version: int) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "dev2", version=version, clean=False, session_expiry=600)
        await sub.connect()
        await sub.subscribe([("plant/+/alarm", 1), ("plant/7/state", 2)])
        await sub.disconnect()
        pub = PahoClient(port, "app")
        await pub.connect()
        for i in range(20):
            await pub.publish(f"plant/{i}/alarm", f"a{i}", 1)
        await pub.publish("plant/7/state", "on", 2)
        await pub.disconnect()
    async with running_gateway(data_dir) as gw:  # a restart between publish and consume
        sub = PahoClient(mqtt_port(gw), "dev2", version=version, clean=False, session_expiry=600)
        flags, _, _ = await sub.connect()
        assert flags.session_present
        got = await sub.receive(21)
        alarms = [m.payload for m in got if m.topic.endswith("alarm")]
        assert alarms == [f"a{i}".encode() for i in range(20)]
        assert [(m.payload, m.qos) for m in got if m.topic == "plant/7/state"] == [(b"on", 2)]
        await sub.nothing_more(0.3)
        await sub.disconnect()
    async with running_gateway(data_dir) as gw:  # acknowledged messages are not sent again
        sub = PahoClient(mqtt_port(gw), "dev2", version=version, clean=False, session_expiry=600)
        await sub.connect()
        await sub.nothing_more(0.5)
        await sub.disconnect()


async def test_clean_start_discards_the_old_session(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "dev3", clean=False)
        await sub.connect()
        await sub.subscribe("x/#", 1)
        await sub.disconnect()
        sub = PahoClient(port, "dev3", clean=True)
        flags, _, _ = await sub.connect()
        assert not flags.session_present
        pub = PahoClient(port, "app")
        await pub.connect()
        await pub.publish("x/1", "gone", 1)
        await sub.nothing_more(0.4)
        await sub.disconnect()
        await pub.disconnect()
        assert "dev3" not in gw.mqtt.sessions


async def test_session_expiry_interval(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        gw.mqtt.settings.expiry_check_interval_s = 0.2
        for task in gw.mqtt._tasks:  # restart the sweeper with the short interval
            if task.get_name() == "mqtt-expiry":
                task.cancel()
        gw.mqtt._tasks.append(asyncio.get_running_loop().create_task(gw.mqtt._expiry_loop()))
        sub = PahoClient(port, "short", version=MQTT_5, clean=False, session_expiry=1)
        await sub.connect()
        await sub.subscribe("e/#", 1)
        await sub.disconnect()
        assert "short" in gw.mqtt.sessions
        await asyncio.sleep(1.6)
        assert "short" not in gw.mqtt.sessions
        sub = PahoClient(port, "short", version=MQTT_5, clean=False, session_expiry=1)
        flags, _, _ = await sub.connect()
        assert not flags.session_present
        await sub.disconnect()


async def test_takeover_disconnects_the_old_connection_with_0x8e(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        connect = Connect("same", MQTT_5, clean_start=False, properties=Properties(session_expiry_interval=60))
        first, _ = await RawClient.connected(port, connect)
        second, ack = await RawClient.connected(port, connect)
        assert ack.session_present
        packets = await first.closed()
        assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x8E)]
        second.send(PingReq())
        assert isinstance(await second.recv(), PingResp)
        await second.close()


async def test_will_on_lost_connection_not_on_disconnect(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        watcher = PahoClient(port, "watcher")
        await watcher.connect()
        await watcher.subscribe("status/#", 1)
        polite = PahoClient(port, "polite", will=("status/polite", "offline", 1, False))
        await polite.connect()
        await polite.disconnect()
        await watcher.nothing_more(0.3)
        rude, _ = await RawClient.connected(port, Connect("rude", MQTT_3_1_1, will=Will("status/rude", b"offline", 1)))
        rude.writer.transport.abort()
        got = await watcher.receive(1)
        assert (got[0].topic, got[0].payload) == ("status/rude", b"offline")
        await watcher.disconnect()


async def test_will_delay_cancelled_by_reconnect(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        watcher = PahoClient(port, "watcher")
        await watcher.connect()
        await watcher.subscribe("status/#", 1)
        will = Will("status/slow", b"gone", 1, properties=Properties(will_delay_interval=1))
        connect = Connect("slow", MQTT_5, clean_start=False, will=will, properties=Properties(session_expiry_interval=60))
        c, _ = await RawClient.connected(port, connect)
        c.writer.transport.abort()
        c, _ = await RawClient.connected(port, connect)  # back before the delay ends
        await watcher.nothing_more(1.5)
        c.writer.transport.abort()  # gone for good this time: the will comes after the delay
        started = time.monotonic()
        got = await watcher.receive(1)
        assert got[0].payload == b"gone" and time.monotonic() - started >= 0.8
        await watcher.disconnect()


async def test_retained_messages(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        pub = PahoClient(port, "pub")
        await pub.connect()
        await pub.publish("home/lamp", "on", 1, retain=True)
        await pub.publish("home/door", "closed", 1, retain=True)
        await pub.publish("home/door", "open", 1, retain=True)  # replaces
        sub = PahoClient(port, "sub")
        await sub.connect()
        await sub.subscribe("home/+", 1)
        got = sorted((m.topic, m.payload, m.retain) for m in await sub.receive(2))
        assert got == [("home/door", b"open", True), ("home/lamp", b"on", True)]
        await pub.publish("home/lamp", "off", 1, retain=True)  # live: delivered with retain 0
        live = await sub.receive(1)
        assert (live[0].payload, live[0].retain) == (b"off", False)
        await pub.publish("home/lamp", "", 1, retain=True)  # clears
        await sub.receive(1)
        await sub.disconnect()
    async with running_gateway(data_dir) as gw:  # retained messages survive a restart
        sub = PahoClient(mqtt_port(gw), "sub2")
        await sub.connect()
        await sub.subscribe("home/#", 0)
        got = await sub.receive(1)
        assert [(m.topic, m.payload) for m in got] == [("home/door", b"open")]
        await sub.nothing_more(0.3)
        await sub.disconnect()


async def test_retain_handling_and_retain_as_published(data_dir: Path) -> None:
    from paho.mqtt.subscribeoptions import SubscribeOptions

    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        pub = PahoClient(port, "pub", version=MQTT_5)
        await pub.connect()
        await pub.publish("rh/a", "kept", 1, retain=True)
        sub = PahoClient(port, "sub", version=MQTT_5)
        await sub.connect()
        await sub.subscribe("rh/+", options=SubscribeOptions(qos=1, retainHandling=2))
        await sub.nothing_more(0.3)
        await sub.subscribe("rh/#", options=SubscribeOptions(qos=1, retainHandling=1, retainAsPublished=True))
        assert [(m.payload, m.retain) for m in await sub.receive(1)] == [(b"kept", True)]
        await sub.subscribe("rh/#", options=SubscribeOptions(qos=1, retainHandling=1, retainAsPublished=True))
        await sub.nothing_more(0.3)  # not a new subscription: nothing sent
        await pub.publish("rh/a", "new", 1, retain=True)
        assert [(m.payload, m.retain) for m in await sub.receive(1)] == [(b"new", True)]
        await sub.disconnect()
        await pub.disconnect()


async def test_keep_alive_is_enforced_at_one_and_a_half_times(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        client, _ = await RawClient.connected(port, Connect("sleepy", MQTT_5, keep_alive=1))
        started = time.monotonic()
        packets = await client.closed(timeout=5)
        elapsed = time.monotonic() - started
        assert 1.4 <= elapsed < 3.0
        assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x8D)]
        alive, _ = await RawClient.connected(port, Connect("awake", MQTT_5, keep_alive=1))
        for _ in range(4):
            await asyncio.sleep(0.5)
            alive.send(PingReq())
            assert isinstance(await alive.recv(), PingResp)
        await alive.close()


async def test_publish_from_a_raw_client_reaches_paho(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub", version=MQTT_5)
        await sub.connect()
        await sub.subscribe("raw/#", 0)
        raw, _ = await RawClient.connected(port, Connect("raw", MQTT_5))
        raw.send(Publish("raw/1", b"hi"))
        assert [m.payload for m in await sub.receive(1)] == [b"hi"]
        await raw.close()
        await sub.disconnect()


async def test_sys_topics(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        watcher = PahoClient(port, "watcher")
        await watcher.connect()
        await watcher.subscribe("$SYS/broker/#", 0)
        everything = PahoClient(port, "everything")
        await everything.connect()
        await everything.subscribe("#", 0)  # '#' must not match $SYS topics
        from gateway.mqtt.sys_topics import publish_sys_topics

        for task in gw.mqtt._tasks:
            if task.get_name() == "mqtt-sys":
                task.cancel()
        gw.mqtt.settings.sys_interval_s = 0.2
        gw.mqtt._tasks.append(asyncio.get_running_loop().create_task(publish_sys_topics(gw.mqtt)))
        await asyncio.sleep(0.6)
        got = {}
        while not watcher.messages.empty():  # the newest value of each topic
            message = watcher.messages.get_nowait()
            got[message.topic] = message.payload
        assert got["$SYS/broker/clients/connected"] == b"2"
        assert got["$SYS/broker/subscriptions/count"] == b"2"
        assert got["$SYS/broker/uptime"].endswith(b" seconds")
        assert int(got["$SYS/broker/bytes/received"]) > 0
        await everything.nothing_more(0.2)
        await watcher.disconnect()
        await everything.disconnect()


async def test_a_completed_qos2_delivery_behind_an_unacknowledged_one_is_not_repeated_after_a_restart(
        data_dir: Path) -> None:
    """A QoS 2 subscription gets a QoS 1 message it does not acknowledge, then a QoS 2 message
    whose exchange it completes. After a restart (the session as stored) the QoS 1 message comes
    again (at least once), the completed QoS 2 one never does: the stored session knows what was
    settled behind its oldest unsettled delivery, not only where that is."""
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        device, _ = await RawClient.connected(port, Connect("mixed", MQTT_3_1_1, clean_start=False))
        device.send(Subscribe(1, [Subscription("mixed/t", 2)]))
        assert isinstance(await device.recv(), SubAck)
        sender = PahoClient(port, "mixed-sender")
        await sender.connect()
        await sender.publish("mixed/t", "q1", 1)
        await sender.publish("mixed/t", "q2", 2)
        first, second = await device.recv(), await device.recv()
        assert (first.payload, first.qos, second.payload, second.qos) == (b"q1", 1, b"q2", 2)
        device.send(PubRec(second.packet_id))  # (no PUBACK for the first)
        assert await device.recv() == PubRel(second.packet_id)
        device.send(PubComp(second.packet_id))
        await asyncio.sleep(0.2)
        await sender.disconnect()
        await device.close()
    async with running_gateway(data_dir) as gw:
        device, connack = await RawClient.connected(mqtt_port(gw), Connect("mixed", MQTT_3_1_1, clean_start=False))
        assert connack.session_present
        again = await device.recv()
        assert (again.payload, again.qos) == (b"q1", 1)
        device.send(PubAck(again.packet_id))
        with pytest.raises(asyncio.TimeoutError):
            packet = await device.recv(timeout=0.5)
            raise AssertionError(f"delivered again: {packet}")
        await device.close()
