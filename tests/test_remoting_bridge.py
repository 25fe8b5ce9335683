"""MQTT <-> remoting through one store: a remoting topic is an MQTT first level, the rest of
the MQTT levels travel in the ``mqttSecondTopic`` property (as apache/rocketmq-mqtt does)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rocketmq import client as rmq

from protocols.mqtt.packets import MQTT_5
from tests.mqtt_support import PahoClient, mqtt_port
from tests.remoting_support import OnsProcess, ons, remoting_gateway
from tests.test_remoting_cpp import producer

pytestmark = pytest.mark.usefixtures("rocketmq_home")


async def test_mqtt_publish_reaches_a_remoting_consumer(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, addr):
        consumer = await OnsProcess.start({"cmd": "consume", "nameSrv": addr, "group": "g-telemetry",
                                           "topic": "Telemetry", "count": 2, "timeoutMs": 20000})
        try:
            await consumer.until("ready")
            await asyncio.sleep(1.5)  # the consumer holds its queues
            device = PahoClient(mqtt_port(gw), "dev-1", version=MQTT_5)
            await device.connect()
            await device.publish("Telemetry/dev-1/temp", b"21.5", qos=1)
            await device.publish("Telemetry", b"top-level", qos=0)
            await device.disconnect()
            events = await consumer.finish()
        finally:
            consumer.kill()
        got = {e["body"]: e for e in events if e["event"] == "message"}
        assert set(got) == {"21.5", "top-level"}
        assert got["21.5"]["topic"] == "Telemetry"
        assert got["21.5"]["properties"]["mqttSecondTopic"] == "/dev-1/temp"
        assert got["21.5"]["properties"]["qoslevel"] == "1"
        assert "mqttSecondTopic" not in got["top-level"]["properties"]


async def test_remoting_send_reaches_mqtt_subscribers(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, addr):
        subscriber = PahoClient(mqtt_port(gw), "ops", version=MQTT_5)
        await subscriber.connect()
        await subscriber.subscribe("Alerts/#", qos=1)
        p = await producer(addr)
        try:
            fire = rmq.Message("Alerts")
            fire.set_body("fire in zone 1")
            fire.set_property("mqttSecondTopic", "/fire/zone1")
            await asyncio.to_thread(p.send_sync, fire)
            await ons({"cmd": "send", "nameSrv": addr, "topic": "Alerts", "messages": [{"body": "all clear"}]})
            got = await subscriber.receive(2)
        finally:
            await asyncio.to_thread(p.shutdown)
            await subscriber.disconnect()
        assert sorted((m.topic, m.payload) for m in got) == [
            ("Alerts", b"all clear"), ("Alerts/fire/zone1", b"fire in zone 1")]


async def test_compressed_bodies_reach_every_protocol_inflated(data_dir: Path) -> None:
    big = "telemetry " * 600  # 6,000 bytes: ali-ons zlib-compresses bodies from 4 KiB on
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, addr):
        subscriber = PahoClient(mqtt_port(gw), "big-sub", version=MQTT_5)
        await subscriber.connect()
        await subscriber.subscribe("Bulk", qos=1)
        await ons({"cmd": "send", "nameSrv": addr, "topic": "Bulk", "messages": [{"body": big}]})
        events = await ons({"cmd": "consume", "nameSrv": addr, "group": "g-bulk", "topic": "Bulk", "count": 1,
                            "timeoutMs": 15000})
        got = await subscriber.receive(1)
        await subscriber.disconnect()
        assert [e["body"] for e in events if e["event"] == "message"] == [big]
        assert got[0].payload == big.encode()
