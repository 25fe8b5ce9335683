"""x-max-length with x-overflow, through aio-pika publishing without waiting and raw frames in
one write: a reject-publish queue never holds more than its limit however many publishes are on
their way (a refused put gives its place back), a message refused by one full queue still
reaches the others it is routed to (nacked under confirms, never returned), and drop-head keeps
the newest whatever feeds the queue (dead letters, MQTT through amq.topic)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest
from aio_pika.exceptions import ChannelPreconditionFailed, DeliveryError
from pamqp import commands

from protocols.amqp.frames import method_frame

from .amqp_support import RawAMQP, port_of, publish
from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .test_bridge_mqtt_amqp import amqp_url
from .test_amqp import amqp_gateway, get


async def held(ch: aio_pika.abc.AbstractChannel, name: str) -> int:
    """The queue's ready messages, as queue.declare (passive) counts them."""
    queue = await ch.declare_queue(name, passive=True)
    return queue.declaration_result.message_count


async def bodies(queue: aio_pika.abc.AbstractQueue) -> list[bytes]:
    got = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        got.append(message.body)
    return got


async def outcomes(publishes) -> list[str]:
    """'ack' or 'nack' for each confirmed publish, in publish order."""
    results = await asyncio.gather(*publishes, return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException) and not isinstance(r, DeliveryError)], results
    return ["nack" if isinstance(r, DeliveryError) else "ack" for r in results]


async def test_pipelined_confirmed_publishes_fill_a_reject_publish_queue_to_its_limit(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        queue = await ch.declare_queue("three", arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
        sent = [ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), "three") for i in range(10)]
        assert await outcomes(sent) == ["ack"] * 3 + ["nack"] * 7
        assert await held(ch, "three") == 3
        assert await bodies(queue) == [b"m0", b"m1", b"m2"]
        # room again: the next publish is taken
        await ch.default_exchange.publish(aio_pika.Message(b"later"), "three")
        assert await bodies(queue) == [b"later"]
        await conn.close()


async def confirms_of(raw: RawAMQP, count: int) -> list[str]:
    """'ack' or 'nack' per publish sequence number 1..count, from the confirms read."""
    seen: dict[int, str] = {}
    while len(seen) < count:
        frame = (await raw.until((commands.Basic.Ack, commands.Basic.Nack)))[-1]
        kind = "ack" if isinstance(frame, commands.Basic.Ack) else "nack"
        tags = range(1, frame.delivery_tag + 1) if frame.multiple else [frame.delivery_tag]
        seen.update((tag, kind) for tag in tags if tag not in seen)
    return [seen[tag] for tag in range(1, count + 1)]


async def test_publishes_in_one_write_fill_a_reject_publish_queue_to_its_limit(data_dir: Path) -> None:
    """Ten publishes read at once (with and without confirms): three are taken, the others
    refused, whether or not the first are stored when the next are read."""
    async with amqp_gateway(data_dir) as (_, url):
        raw = await RawAMQP.open(port_of(url))
        limit = {"x-max-length": 3, "x-overflow": "reject-publish"}
        raw.writer.write(method_frame(1, commands.Channel.Open())
                         + method_frame(1, commands.Queue.Declare(queue="confirmed", arguments=limit))
                         + method_frame(1, commands.Queue.Declare(queue="unconfirmed", arguments=limit))
                         + method_frame(1, commands.Confirm.Select()) + method_frame(2, commands.Channel.Open()))
        await raw.until(commands.Channel.OpenOk)
        await raw.until(commands.Channel.OpenOk)
        raw.writer.write(b"".join(publish(1, "confirmed", f"c{i}".encode()) for i in range(10))
                         + b"".join(publish(2, "unconfirmed", f"u{i}".encode()) for i in range(10)))
        assert await confirms_of(raw, 10) == ["ack"] * 3 + ["nack"] * 7
        for name in ("confirmed", "unconfirmed"):
            raw.writer.write(method_frame(2, commands.Queue.Declare(queue=name, passive=True)))
            declared = (await raw.until(commands.Queue.DeclareOk))[-1]
            assert (declared.queue, declared.message_count) == (name, 3)
        raw.writer.close()


async def test_pipelined_publishes_without_confirms_fill_a_reject_publish_queue_to_its_limit(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=False)
        queue = await ch.declare_queue("three", arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
        await asyncio.gather(*(ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), "three")
                               for i in range(10)))
        assert await held(ch, "three") == 3
        assert await bodies(queue) == [b"m0", b"m1", b"m2"]
        await conn.close()


async def test_a_full_queue_refuses_its_copy_only(data_dir: Path) -> None:
    """As RabbitMQ: the message still goes to every other queue it is routed to; under confirms
    it is nacked; it was routed, so a mandatory publish is not returned."""
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True, on_return_raises=False)
        returned: list[bytes] = []
        ch.return_callbacks.add(lambda _channel, message: returned.append(message.body))
        fanout = await ch.declare_exchange("spread", aio_pika.ExchangeType.FANOUT)
        full = await ch.declare_queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        roomy = await ch.declare_queue("roomy")
        dropping = await ch.declare_queue("dropping", arguments={"x-max-length": 2})
        for queue in (full, roomy, dropping):
            await queue.bind(fanout)
        sent = [fanout.publish(aio_pika.Message(f"f{i}".encode()), "", mandatory=True) for i in range(4)]
        assert await outcomes(sent) == ["ack", "nack", "nack", "nack"]
        assert await bodies(full) == [b"f0"]
        assert await bodies(roomy) == [b"f0", b"f1", b"f2", b"f3"]
        assert await bodies(dropping) == [b"f2", b"f3"]
        # routed to the full queue alone: nacked, not returned
        await full.unbind(fanout)
        await roomy.unbind(fanout)
        await dropping.unbind(fanout)
        await ch.default_exchange.publish(aio_pika.Message(b"fills"), "full")
        results = await outcomes([ch.default_exchange.publish(aio_pika.Message(b"over"), "full", mandatory=True)])
        assert results == ["nack"]
        await ch.default_exchange.publish(aio_pika.Message(b"nowhere"), "no-such-queue", mandatory=True)
        await asyncio.sleep(0)  # (the return came before the confirm: its callback has run)
        assert returned == [b"nowhere"]
        await conn.close()


async def test_pipelined_publishes_keep_the_newest_in_a_drop_head_queue(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        queue = await ch.declare_queue("newest", arguments={"x-max-length": 3})
        sent = [ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), "newest") for i in range(10)]
        assert await outcomes(sent) == ["ack"] * 10
        assert await held(ch, "newest") == 3
        assert await bodies(queue) == [b"m7", b"m8", b"m9"]
        await conn.close()


async def test_a_dead_letter_is_not_added_to_a_full_reject_publish_queue(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        parking = await ch.declare_queue("parking", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        work = await ch.declare_queue("work", arguments={"x-dead-letter-exchange": "",
                                                         "x-dead-letter-routing-key": "parking"})
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(f"w{i}".encode()), "work")
        for _ in range(3):
            message = await get(work)
            await message.reject(requeue=False)
        await ch.default_exchange.publish(aio_pika.Message(b"probe"), "work")  # (after the dead letters)
        assert (await get(work)).body == b"probe"
        assert await bodies(parking) == [b"w0"]
        await conn.close()


async def test_dead_letters_keep_the_newest_in_a_drop_head_queue(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        parking = await ch.declare_queue("parking", arguments={"x-max-length": 1})
        work = await ch.declare_queue("work", arguments={"x-dead-letter-exchange": "",
                                                         "x-dead-letter-routing-key": "parking"})
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(f"w{i}".encode()), "work")
        for _ in range(3):
            message = await get(work)
            await message.reject(requeue=False)
        await ch.default_exchange.publish(aio_pika.Message(b"probe"), "work")  # (after the dead letters)
        assert (await get(work)).body == b"probe"
        assert await bodies(parking) == [b"w2"]
        await conn.close()


async def test_mqtt_publishes_through_amq_topic_keep_the_newest_in_a_drop_head_queue(data_dir: Path) -> None:
    """x-max-length bounds a queue whatever protocol feeds it: MQTT publishes bound in through
    amq.topic included."""
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0") as gw:
        conn = await aio_pika.connect(amqp_url(gw))
        ch = await conn.channel()
        latest = await ch.declare_queue("latest", arguments={"x-max-length": 2})
        await latest.bind("amq.topic", "sensors.#")
        device = PahoClient(mqtt_port(gw), "device")
        await device.connect()
        for i in range(5):
            await device.publish("sensors/t", f"m{i}", 1)
        await device.disconnect()
        for _ in range(100):  # (the store's notify reaches the queue after the PUBACKs)
            if await held(ch, "latest") <= 2:
                break
            await asyncio.sleep(0.05)
        assert await bodies(latest) == [b"m3", b"m4"]
        await conn.close()


async def test_a_publish_the_store_refuses_gives_its_place_back(data_dir: Path) -> None:
    limit = 64 << 10
    async with amqp_gateway(data_dir, max_message_size=limit) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("one", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        # a body within the limit, a record (with its properties) over it: refused by the store
        too_large = aio_pika.Message(b"x" * (limit - 16), headers={"pad": "p" * 1024})
        with pytest.raises(ChannelPreconditionFailed):
            await ch.default_exchange.publish(too_large, "one")
        ch = await conn.channel(publisher_confirms=True)
        await ch.default_exchange.publish(aio_pika.Message(b"fits"), "one")  # (acked: the place is free)
        assert await bodies(await ch.get_queue("one")) == [b"fits"]
        await conn.close()
