"""The default size limits, through real clients: an MQTT packet up to ``mqtt_max_packet_size``
(16 MiB, as RabbitMQ 4.1; advertised in a 5.0 CONNACK) is stored and delivered once, with no
resend loop; one byte more is refused (5.0: DISCONNECT 0x95, 3.1.1: closed); an AMQP body
of 16 MiB (RabbitMQ 4's default limit) is confirmed and consumed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest

from gateway.config import Config
from protocols.mqtt.packets import MQTT_3_1_1, MQTT_5
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway

PACKET_LIMIT = Config(data_dir=Path(".")).mqtt_max_packet_size
TOPIC = "big/x"


def payload_filling(packet_size: int, version: int) -> bytes:
    """A QoS 1 PUBLISH payload that makes the whole packet ``packet_size`` bytes."""
    variable = 2 + len(TOPIC) + 2 + (1 if version == MQTT_5 else 0)  # topic, packet id, (5.0) no properties
    remaining = packet_size - 1 - 4  # fixed header: the type byte, then the remaining length's bytes
    for width in (1, 2, 3, 4):
        if packet_size - 1 - width < 128 ** width:
            remaining = packet_size - 1 - width
            break
    return b"p" * (remaining - variable)


def test_the_defaults_take_what_users_of_the_peers_send() -> None:
    config = Config(data_dir=Path("."))
    assert config.mqtt_max_packet_size == 16 << 20
    # the store's limit leaves room for what is stored with a full packet (its queue list)
    assert config.max_message_size == 20 << 20


async def test_connack_advertises_the_packet_limit(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        client = PahoClient(mqtt_port(gw), "asker", version=MQTT_5)
        _, _, props = await client.connect()
        assert props.MaximumPacketSize == PACKET_LIMIT
        await client.disconnect()


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5], ids=["3.1.1", "5.0"])
async def test_a_packet_at_the_limit_is_stored_and_delivered_once(data_dir: Path, version: int) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub", version=version)
        await sub.connect()
        await sub.subscribe("big/#", 1)
        pub = PahoClient(port, "pub", version=version)
        await pub.connect()
        payload = payload_filling(PACKET_LIMIT, version)
        await pub.publish(TOPIC, payload, 1)  # PUBACKed
        assert [len(m.payload) for m in await sub.receive(1, timeout=30)] == [len(payload)]
        await sub.nothing_more(1.0)  # not sent again: no resend loop
        assert pub.disconnects.empty() and sub.disconnects.empty()
        await pub.disconnect()
        await sub.disconnect()


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5], ids=["3.1.1", "5.0"])
async def test_a_packet_over_the_limit_is_refused(data_dir: Path, version: int) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        pub = PahoClient(port, "pub", version=version)
        await pub.connect()
        pub.client.publish(TOPIC, payload_filling(PACKET_LIMIT + 1, version), 1)
        # refused at its fixed header (5.0: DISCONNECT 0x95, read by paho while it still writes)
        reason = await asyncio.to_thread(pub.disconnects.get, True, 30)
        pub.client.loop_stop()  # (paho ignores the CONNACK's Maximum Packet Size: it would resend)
        if version == MQTT_5:
            assert reason.value == 0x95, reason
        assert gw.mqtt is not None and gw.mqtt.stats.messages_received == 0


async def test_an_amqp_body_of_16_mib_is_confirmed_and_consumed(data_dir: Path) -> None:
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0") as gw:
        port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue("big", durable=True)
            body = b"b" * (16 << 20)
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key="big")
            got = await queue.get(timeout=30)
            assert len(got.body) == len(body)
            await got.ack()
