"""The x-delayed-message exchange (RabbitMQ's delayed-message plugin) through pika and aio-pika:
a publish with an "x-delay" header is confirmed once stored and reaches its queues at its time,
never early, and across a kill -9; the exchange routes as its "x-delayed-type" says."""

from __future__ import annotations

import time
from pathlib import Path

import aio_pika
import pika
import pytest
from aio_pika.exceptions import ChannelPreconditionFailed

from .crash_support import free_port, kill9, start_gateway, stop
from .test_amqp import amqp_gateway


async def declare(channel: aio_pika.abc.AbstractChannel, delayed_type: str = "topic") -> aio_pika.abc.AbstractExchange:
    return await channel.declare_exchange("delays", "x-delayed-message", durable=True,
                                          arguments={"x-delayed-type": delayed_type})


async def test_a_delayed_publish_is_in_its_queue_at_its_time(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (gw, url):
        conn = await aio_pika.connect(url)
        channel = await conn.channel(publisher_confirms=True)
        exchange = await declare(channel)
        queue = await channel.declare_queue("jobs", durable=True)
        await queue.bind(exchange, "job.*")
        other = await channel.declare_queue("other", durable=True)
        await other.bind(exchange, "nothing.*")
        sent = time.monotonic()
        await exchange.publish(aio_pika.Message(b"later", headers={"x-delay": 2000}), "job.a")  # confirmed: stored
        await exchange.publish(aio_pika.Message(b"now", headers={"x-delay": 0}), "job.b")
        await exchange.publish(aio_pika.Message(b"plain"), "job.c")
        got = []
        async with queue.iterator() as messages:
            async for message in messages:
                got.append((message.body, time.monotonic() - sent))
                await message.ack()
                if len(got) == 3:
                    break
        assert [body for body, _ in got] == [b"now", b"plain", b"later"]
        assert got[2][1] >= 2.0  # never early
        assert await other.get(fail=False) is None
        await conn.close()


async def test_a_delayed_exchange_needs_a_routing_type_and_is_no_binding_destination(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (gw, url):
        conn = await aio_pika.connect(url)
        channel = await conn.channel()
        with pytest.raises(ChannelPreconditionFailed, match="x-delayed-type"):
            await channel.declare_exchange("bad", "x-delayed-message")
        channel = await conn.channel()
        delays = await declare(channel, "direct")
        source = await channel.declare_exchange("source", "fanout")
        with pytest.raises(ChannelPreconditionFailed, match="not a destination"):
            await delays.bind(source)
        await conn.close()


def test_a_confirmed_delayed_publish_survives_kill_9(data_dir: Path) -> None:
    port = free_port()
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        channel = conn.channel()
        channel.confirm_delivery()
        channel.exchange_declare("delays", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        channel.queue_declare("late", durable=True)
        channel.queue_bind("late", "delays", "k")
        published = time.monotonic()
        channel.basic_publish("delays", "k", b"held", pika.BasicProperties(delivery_mode=2, headers={"x-delay": 1500}))
        kill9(proc)  # right after the confirm
        proc = start_gateway(data_dir, amqp_port=port)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        channel = conn.channel()
        bodies = []
        for method, _, body in channel.consume("late", inactivity_timeout=5):
            if method is None:
                break
            bodies.append((body, time.monotonic() - published))
            channel.basic_ack(method.delivery_tag)
            if len(bodies) == 1:
                break
        assert [b for b, _ in bodies] == [b"held"] and bodies[0][1] >= 1.5
        assert channel.basic_get("late")[0] is None  # once
        conn.close()
    finally:
        stop(proc)
