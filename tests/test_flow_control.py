"""The store's resource alarm (RabbitMQ's disk alarm): publishers over AMQP and MQTT are held
while it is raised and go on when it clears, AMQP clients are told (connection.blocked), and
consumers keep receiving meanwhile. Also the AMQP queue housekeeping that runs without a
consumer: x-expires and head-of-queue TTL expiry."""

from __future__ import annotations

import asyncio
import queue
import time
from pathlib import Path

import aio_pika
import pytest
from aio_pika.exceptions import ChannelNotFoundEntity

from gateway.server import Gateway
from protocols.mqtt.packets import MQTT_5
from tests.mqtt_support import PahoClient, mqtt_port
from tests.test_amqp import amqp_gateway, get

TIMEOUT = 5.0
NO_FREE_SPACE_IS_ENOUGH = 1 << 62


async def until(condition, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def raise_alarm(gw: Gateway) -> None:
    assert gw.pressure is not None
    gw.pressure.disk_free_limit = NO_FREE_SPACE_IS_ENOUGH
    await until(lambda: gw.pressure.raised, "the alarm")


async def clear_alarm(gw: Gateway) -> None:
    assert gw.pressure is not None
    gw.pressure.disk_free_limit = 0
    await until(lambda: not gw.pressure.raised, "the alarm to clear")


async def message_count(channel: aio_pika.abc.AbstractChannel, name: str) -> int:
    declared = await channel.declare_queue(name, passive=True)
    return declared.declaration_result.message_count


async def test_amqp_publisher_is_blocked_and_told_while_the_alarm_is_raised(data_dir: Path) -> None:
    import pika

    async with amqp_gateway(data_dir) as (gw, url):
        port = int(url.rsplit(":", 1)[1].strip("/"))
        app = await aio_pika.connect(url)
        ch = await app.channel()
        await ch.declare_queue("flow", durable=True)
        await ch.declare_queue("to-consume", durable=True)
        await ch.default_exchange.publish(aio_pika.Message(b"before"), "to-consume")
        await until(lambda: gw.amqp.queues["to-consume"].ready_count() == 1, "the first message")

        notices: queue.Queue[str] = queue.Queue()
        conn = await asyncio.to_thread(pika.BlockingConnection, pika.ConnectionParameters(
            "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")))
        conn.add_on_connection_blocked_callback(lambda c, frame: notices.put(type(frame.method).__name__))
        conn.add_on_connection_unblocked_callback(lambda c, frame: notices.put(type(frame.method).__name__))
        pch = await asyncio.to_thread(conn.channel)

        async def pika_notice() -> str:
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                await asyncio.to_thread(conn.process_data_events, 0.1)
                if not notices.empty():
                    return notices.get_nowait()
            raise AssertionError("no connection.blocked / unblocked notice")

        try:
            await raise_alarm(gw)
            assert await pika_notice() == "Blocked"
            await asyncio.to_thread(pch.basic_publish, "", "flow", b"held", pika.BasicProperties(delivery_mode=2))
            await asyncio.sleep(0.5)
            assert await message_count(ch, "flow") == 0  # not stored while the alarm is raised
            consumed = await get(await ch.get_queue("to-consume"))  # consumers go on
            assert consumed.body == b"before"
            await consumed.ack()

            await clear_alarm(gw)
            assert await pika_notice() == "Unblocked"
            held = await get(await ch.get_queue("flow"))
            assert held.body == b"held"
        finally:
            await asyncio.to_thread(conn.close)
            await app.close()


async def test_mqtt_publisher_waits_while_the_alarm_is_raised(data_dir: Path) -> None:
    async with amqp_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, _):
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub", version=MQTT_5)
        pub = PahoClient(port, "pub", version=MQTT_5)
        await sub.connect()
        await pub.connect()
        await sub.subscribe("alarm/t", qos=1)
        await raise_alarm(gw)
        info = pub.client.publish("alarm/t", b"held", qos=1)
        await asyncio.sleep(0.5)
        assert not info.is_published()  # no PUBACK: not stored yet
        await sub.nothing_more(0.1)
        await clear_alarm(gw)
        await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
        assert info.is_published()
        assert [m.payload for m in await sub.receive(1)] == [b"held"]
        await pub.disconnect()
        await sub.disconnect()


async def test_unused_queue_expires_after_x_expires(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (gw, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.declare_queue("short-lived", arguments={"x-expires": 300})
        used = await ch.declare_queue("in-use", arguments={"x-expires": 300})
        async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            pass

        await used.consume(ignore)
        await until(lambda: "short-lived" not in gw.amqp.queues, "x-expires", timeout=4.0)
        with pytest.raises(ChannelNotFoundEntity):
            await (await conn.channel()).declare_queue("short-lived", passive=True)
        assert "in-use" in gw.amqp.queues  # a queue with a consumer is in use
        await conn.close()


async def test_expired_messages_are_dead_lettered_without_a_consumer(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.declare_queue("dead")
        await ch.declare_queue("ttl", arguments={
            "x-message-ttl": 100, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        await ch.default_exchange.publish(aio_pika.Message(b"stale"), "ttl")
        deadline = time.monotonic() + 4.0
        while await message_count(ch, "dead") == 0:  # nobody reads "ttl": the sweep expires it
            assert time.monotonic() < deadline, "the expired message was not dead-lettered"
            await asyncio.sleep(0.1)
        assert await message_count(ch, "ttl") == 0
        dead = await get(await ch.get_queue("dead"))
        assert dead.body == b"stale" and dead.headers["x-death"][0]["reason"] == "expired"
        await conn.close()
