"""A gateway node's relay names its client's publishes (protocols/amqp/relay_identity.py): after
a failover, what it publishes again under the number of its first publish is confirmed and not
stored twice when the (new) server already holds it, and stored when it does not; the relay's
header never reaches a consumer. Through aiormq (aio-pika's connection, which sends client
properties given to it; aio-pika's own ``connect`` drops them when given a URL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import aiormq
from pamqp import commands

from .test_amqp import amqp_gateway

TOKEN = "0123456789abcdef"


async def relayed(url: str, generation: int) -> aiormq.abc.AbstractConnection:
    connection = aiormq.Connection(url)
    await connection.connect(client_properties={"x-tidemq-relay": f"{TOKEN}.{generation}"})
    return connection


async def publish(channel: aiormq.abc.AbstractChannel, body: bytes, headers: dict | None) -> None:
    confirm = await channel.basic_publish(body, routing_key="relayed",
                                          properties=commands.Basic.Properties(headers=headers, delivery_mode=2))
    assert isinstance(confirm, commands.Basic.Ack)


async def drained(url: str, queue_name: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(queue_name, durable=True, passive=True)
        got = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            got.append(message)
        return got
    finally:
        await connection.close()


async def test_a_relayed_publish_sent_again_is_confirmed_and_not_stored_twice(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        first = await relayed(url, 0)
        channel = await first.channel(publisher_confirms=True)
        await channel.queue_declare("relayed", durable=True)
        for body in (b"m0", b"m1", b"m2"):  # numbers 1-3 of generation 0, channel 1
            await publish(channel, body, None)
        await first.close()

        # the next generation (after a failover): m1 and m2 sent again under their first numbers
        # (their confirms were lost with the old server), then a new publish, then one sent
        # again that no server stored (its old server died before writing it)
        second = await relayed(url, 1)
        channel = await second.channel(publisher_confirms=True)
        for body, origin in ((b"m1", "0:2"), (b"m2", "0:3"), (b"m3", None), (b"m4", "0:4")):
            await publish(channel, body, {"x-tidemq-origin": origin, "app": "kept"} if origin else {"app": "kept"})
        await second.close()

        got = await drained(url, "relayed")
        assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert [dict(m.headers or {}) for m in got[3:]] == [{"app": "kept"}, {"app": "kept"}]
        assert not [m for m in got if "x-tidemq-origin" in (m.headers or {})]


async def test_relayed_publishes_read_together_are_each_found_when_sent_again(data_dir: Path) -> None:
    """A relay's publishes that arrive together are stored in one put, each under its own
    number: after a failover, any of them sent again alone is confirmed and not stored twice."""
    async with amqp_gateway(data_dir) as (_, url):
        first = await relayed(url, 0)
        channel = await first.channel(publisher_confirms=True)
        await channel.queue_declare("relayed", durable=True)
        await asyncio.gather(*(publish(channel, b"m%d" % i, None) for i in range(1, 41)))  # numbers 1-40
        await first.close()

        second = await relayed(url, 1)
        channel = await second.channel(publisher_confirms=True)
        again = [(b"m%d" % i, f"0:{i}") for i in (7, 23, 40)]
        for body, origin in [*again, (b"new", None)]:
            await publish(channel, body, {"x-tidemq-origin": origin} if origin else None)
        await second.close()

        got = await drained(url, "relayed")
        assert [m.body for m in got] == [b"m%d" % i for i in range(1, 41)] + [b"new"]


async def test_an_ordinary_client_is_not_numbered(data_dir: Path) -> None:
    """Without the relay's property a connection's publishes are not numbered, so the same
    publish sent twice is stored twice, and its headers are its own."""
    async with amqp_gateway(data_dir) as (_, url):
        connection = await aio_pika.connect(url)
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("plain", durable=True)
        for _ in range(2):
            await channel.default_exchange.publish(aio_pika.Message(b"same", headers={"x-tidemq-origin": "0:1"}),
                                                   routing_key="plain")
        await connection.close()
        got = await drained(url, "plain")
        assert [(m.body, dict(m.headers or {})) for m in got] == [(b"same", {"x-tidemq-origin": "0:1"})] * 2
