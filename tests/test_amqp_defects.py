"""AMQP defects found by independent clients (issue 18): an oversize message refused alone,
amq.topic publishes that are never confirmed or not returned, queue arguments accepted and
ignored, x-death entries never combined, exchange redeclarations accepted. Through aio-pika,
paho and raw frames over real sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest
from aio_pika.exceptions import ChannelPreconditionFailed, DeliveryError
from pamqp import commands

from protocols.amqp.frames import method_frame

from .amqp_support import RawAMQP, port_of, publish
from .mqtt_support import PahoClient
from .test_amqp import amqp_gateway, get

TIMEOUT = 5.0


@pytest.mark.parametrize("relayed", [False, True], ids=["client", "relayed"])
async def test_an_oversize_message_is_refused_alone(data_dir: Path, relayed: bool) -> None:
    """A, X (too large), B on channel 1 and C on channel 2 in one write: X closes channel 1
    with 406 naming both sizes (as RabbitMQ); A and C are stored; B, sent on the channel after
    X, is dropped with it (spec 2.2.5). (A's confirm may be lost with the channel, as with
    RabbitMQ: what was not confirmed is unknown to the publisher.) The same through a gateway
    node's relay, whose confirming channels' publishes are put one by one (relay_identity.py)."""
    limit = 64 << 10
    async with amqp_gateway(data_dir, max_message_size=limit, flush="sync") as (gw, url):
        properties = {"x-tidemq-relay": "0123456789abcdef.0"} if relayed else None
        raw = await RawAMQP.open(port_of(url), client_properties=properties)
        setup = [method_frame(1, commands.Channel.Open()), method_frame(2, commands.Channel.Open()),
                 method_frame(1, commands.Queue.Declare(queue="big")), method_frame(1, commands.Confirm.Select())]
        raw.writer.write(b"".join(setup))
        await raw.until(commands.Confirm.SelectOk)
        too_large = limit + 1
        raw.writer.write(publish(1, "big", b"A" * 100) + publish(1, "big", b"X" * too_large)
                         + publish(1, "big", b"B") + publish(2, "big", b"C"))
        frames = await raw.until(commands.Channel.Close)
        close = frames[-1]
        assert close.reply_code == 406 and (close.class_id, close.method_id) == (60, 40)
        assert f"message size {too_large} is larger than configured max size {limit}" in close.reply_text
        raw.writer.write(method_frame(1, commands.Channel.CloseOk()))
        # a body under the limit whose record (with its headers) is over: refused by the store alone
        raw.writer.write(method_frame(1, commands.Channel.Open()) + method_frame(1, commands.Confirm.Select()))
        await raw.until(commands.Confirm.SelectOk)
        raw.writer.write(publish(1, "big", b"D") + publish(1, "big", b"Y" * (limit - 50), {"pad": "p" * 2000})
                         + publish(2, "big", b"E") + publish(1, "big", b"Z"))
        frames = await raw.until(commands.Channel.Close)
        assert frames[-1].reply_code == 406 and str(limit) in frames[-1].reply_text
        conn = await aio_pika.connect(url)
        queue = await (await conn.channel()).declare_queue("big", passive=True)
        bodies = set()
        for _ in range(4):
            message = await get(queue)
            bodies.add(message.body)
            await message.ack()
        assert bodies == {b"A" * 100, b"C", b"D", b"E"}
        assert await queue.get(fail=False) is None
        assert gw.store.max_offset_now("q:big") == 4
        await conn.close()
        raw.writer.close()


async def test_amq_topic_publishes_are_confirmed_or_returned(data_dir: Path) -> None:
    """Routing keys that cannot be MQTT topics are confirmed (not left hanging); a mandatory
    publish that nothing takes -- no binding, no MQTT subscriber -- comes back (312), then is
    confirmed; one an MQTT subscription reads, online or offline, is delivered, not returned."""
    async with amqp_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
        topic = await ch.get_exchange("amq.topic")
        for key in ("", "a.#", "a.+", "$SYS.x", "nobody.home"):
            await asyncio.wait_for(topic.publish(aio_pika.Message(b"m"), key, mandatory=False), TIMEOUT)
        for key in ("a.#", "nobody.home"):
            with pytest.raises(DeliveryError) as returned:
                await asyncio.wait_for(topic.publish(aio_pika.Message(b"r"), key, mandatory=True), TIMEOUT)
            assert returned.value.frame is not None and returned.value.frame.reply_code == 312
        mqtt_port = next(li.address[1] for li in gw.listeners if li.protocol == "mqtt")
        sub = PahoClient(mqtt_port, "sub")
        await sub.connect()
        await sub.subscribe("somebody/home", 0)
        await asyncio.wait_for(topic.publish(aio_pika.Message(b"read"), "somebody.home", mandatory=True), TIMEOUT)
        assert [m.payload for m in await sub.receive(1)] == [b"read"]
        await sub.disconnect()
        # a persistent session subscribed to the topic, offline: it takes the message (no return)
        parked = PahoClient(mqtt_port, "parked", clean=False)
        await parked.connect()
        await parked.subscribe("parked/topic", 1)
        await parked.disconnect()
        await asyncio.wait_for(topic.publish(aio_pika.Message(b"kept"), "parked.topic", mandatory=True), TIMEOUT)
        parked = PahoClient(mqtt_port, "parked", clean=False)
        await parked.connect()
        assert [m.payload for m in await parked.receive(1)] == [b"kept"]
        await parked.disconnect()
        # the channel still works: every publish above was confirmed in turn
        await asyncio.wait_for(ch.default_exchange.publish(aio_pika.Message(b"x"), "none", mandatory=False),
                               TIMEOUT)
        await conn.close()


async def test_unsupported_queue_arguments_are_refused(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        for argument in ("x-max-priority", "x-max-length-bytes"):
            ch = await conn.channel()
            with pytest.raises(ChannelPreconditionFailed, match=argument):
                await ch.declare_queue("prio", arguments={argument: 10})
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue("prio", passive=True)  # never created
        await conn.close()


async def test_x_death_entries_are_combined_with_a_count(data_dir: Path) -> None:
    """The retry loop: rejected from "work" into "wait", expired from "wait" back into "work",
    three times. As RabbitMQ: one x-death entry per (queue, reason), count 3, a time."""
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        retry = await ch.declare_exchange("retry", aio_pika.ExchangeType.FANOUT)
        wait = await ch.declare_queue("wait", arguments={
            "x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work"})
        await wait.bind(retry)
        work = await ch.declare_queue("work", arguments={"x-dead-letter-exchange": "retry"})
        await ch.default_exchange.publish(aio_pika.Message(b"job"), "work")
        for _ in range(3):
            message = await get(work)
            await message.reject(requeue=False)
        message = await get(work)
        deaths = message.headers["x-death"]
        assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [("wait", "expired", 3),
                                                                             ("work", "rejected", 3)]
        for death in deaths:
            assert death["time"] is not None and death["routing-keys"] and "exchange" in death
        assert message.headers["x-first-death-queue"] == "work"
        assert message.headers["x-first-death-reason"] == "rejected"
        await message.ack()
        await conn.close()


async def test_exchange_redeclaration_names_the_inequivalent_argument(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.declare_exchange("x", aio_pika.ExchangeType.DIRECT, durable=True, arguments={"x-note": "a"})
        await ch.declare_exchange("x", aio_pika.ExchangeType.DIRECT, durable=True, arguments={"x-note": "a"})
        cases = [
            ({"durable": False}, "inequivalent arg 'durable' for exchange 'x' in vhost '/': received 'false' "
                                 "but current is 'true'"),
            ({"auto_delete": True}, "inequivalent arg 'auto_delete' for exchange 'x' in vhost '/': received 'true' "
                                    "but current is 'false'"),
            ({"internal": True}, "inequivalent arg 'internal'"),
            ({"arguments": {}}, "inequivalent arg 'x-note' for exchange 'x' in vhost '/': received none "
                                "but current is 'a'"),
        ]
        for change, text in cases:
            ch = await conn.channel()
            kwargs = {"durable": True, "arguments": {"x-note": "a"}, **change}
            with pytest.raises(ChannelPreconditionFailed) as refused:
                await ch.declare_exchange("x", aio_pika.ExchangeType.DIRECT, **kwargs)
            assert text in str(refused.value)
        ch = await conn.channel()  # an argument whose feature is not built: refused, not ignored
        with pytest.raises(ChannelPreconditionFailed, match="alternate-exchange"):
            await ch.declare_exchange("ae", aio_pika.ExchangeType.DIRECT, arguments={"alternate-exchange": "x"})
        await conn.close()
