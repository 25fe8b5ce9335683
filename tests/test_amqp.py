"""AMQP 0-9-1 through aio-pika (and pika): exchanges, queues, confirms, prefetch, nack/requeue,
dead-lettering, TTL, max-length, restarts with durable state, errors with their reply codes."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, AsyncIterator

import aio_pika
import pytest
from aio_pika.exceptions import ChannelClosed, ChannelNotFoundEntity, ChannelPreconditionFailed

from gateway.config import Config
from gateway.server import Gateway

TIMEOUT = 5.0


@contextlib.asynccontextmanager
async def amqp_gateway(data_dir: Path, **config: Any) -> AsyncIterator[tuple[Gateway, str]]:
    config.setdefault("mqtt_bind", "")
    gw = Gateway(Config(data_dir=data_dir, amqp_bind="127.0.0.1:0", remoting_bind="", **config))
    await gw.start()
    port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
    try:
        yield gw, f"amqp://guest:guest@127.0.0.1:{port}/"
    finally:
        await gw.stop()


@contextlib.asynccontextmanager
async def publisher_and_consumer(url: str, queue_name: str, *, no_ack: bool = False
                                 ) -> AsyncIterator[tuple[aio_pika.abc.AbstractChannel, asyncio.Queue[bytes]]]:
    """Two connections: a channel with publisher confirms, and a consumer of the durable queue
    ``queue_name`` (acking each message unless ``no_ack``); yields (the publisher's channel,
    the bodies consumed, in order)."""
    publisher = await aio_pika.connect(url)
    consumer = await aio_pika.connect(url)
    try:
        pub = await publisher.channel(publisher_confirms=True)
        await pub.declare_queue(queue_name, durable=True)
        sub = await consumer.channel()
        queue = await sub.declare_queue(queue_name, durable=True)
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await got.put(message.body)
            if not no_ack:
                await message.ack()

        await queue.consume(on_message, no_ack=no_ack)
        yield pub, got
    finally:
        await publisher.close()
        await consumer.close()


async def get(queue: aio_pika.abc.AbstractQueue) -> aio_pika.abc.AbstractIncomingMessage:
    for _ in range(50):
        message = await queue.get(fail=False)
        if message is not None:
            return message
        await asyncio.sleep(0.05)
    raise AssertionError(f"no message on {queue.name}")


async def test_exchange_types_route_as_rabbitmq(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        direct = await ch.declare_exchange("d", aio_pika.ExchangeType.DIRECT)
        fanout = await ch.declare_exchange("f", aio_pika.ExchangeType.FANOUT)
        topic = await ch.declare_exchange("t", aio_pika.ExchangeType.TOPIC)
        headers = await ch.declare_exchange("h", aio_pika.ExchangeType.HEADERS)
        q = {name: await ch.declare_queue(name) for name in ("q1", "q2", "q3", "q4")}
        await q["q1"].bind(direct, "red")
        await q["q2"].bind(fanout)
        await q["q3"].bind(fanout)
        await q["q3"].bind(topic, "stock.#")
        await q["q4"].bind(topic, "*.eu.*")
        await q["q4"].bind(headers, arguments={"x-match": "any", "kind": "alert", "level": "high"})
        await direct.publish(aio_pika.Message(b"d-red"), "red")
        await direct.publish(aio_pika.Message(b"d-blue"), "blue")  # unroutable: dropped
        await fanout.publish(aio_pika.Message(b"f"), "ignored")
        await topic.publish(aio_pika.Message(b"t-stock"), "stock.usd.nyse")
        await topic.publish(aio_pika.Message(b"t-eu"), "quote.eu.fr")
        await topic.publish(aio_pika.Message(b"t-none"), "quote.us")
        await headers.publish(aio_pika.Message(b"h-any", headers={"kind": "alert"}), "")
        await headers.publish(aio_pika.Message(b"h-none", headers={"kind": "info"}), "")
        await ch.default_exchange.publish(aio_pika.Message(b"default"), "q1")
        expected = {"q1": [b"d-red", b"default"], "q2": [b"f"], "q3": [b"f", b"t-stock"], "q4": [b"t-eu", b"h-any"]}
        for name, bodies in expected.items():
            got = []
            for _ in bodies:
                message = await get(q[name])
                await message.ack()
                got.append(message.body)
            assert got == bodies, name
            assert await q[name].get(fail=False) is None
        await conn.close()


async def test_confirms_and_mandatory_return(data_dir: Path) -> None:
    async with amqp_gateway(data_dir, flush="sync") as (gw, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True, on_return_raises=False)
        returned: list[bytes] = []
        ch.return_callbacks.add(lambda channel, message: returned.append(message.body))
        await ch.declare_queue("jobs", durable=True)
        for i in range(20):  # each await returns once the broker confirmed (raises on a nack)
            await ch.default_exchange.publish(aio_pika.Message(f"{i}".encode(), delivery_mode=2), "jobs")
        assert gw.store.max_offset_now("q:jobs") == 20  # confirmed means stored
        await ch.default_exchange.publish(aio_pika.Message(b"lost"), "no-such-queue", mandatory=True)
        for _ in range(40):
            if returned:
                break
            await asyncio.sleep(0.05)
        assert returned == [b"lost"]
        await conn.close()


async def test_prefetch_bounds_unacked_deliveries(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=3)
        queue = await ch.declare_queue("pf")
        for i in range(10):
            await ch.default_exchange.publish(aio_pika.Message(f"{i}".encode()), "pf")
        held: list[aio_pika.abc.AbstractIncomingMessage] = []
        await queue.consume(held.append)
        await asyncio.sleep(0.5)
        assert [m.body for m in held] == [b"0", b"1", b"2"]  # the window is full
        await held[0].ack()
        await asyncio.sleep(0.3)
        assert [m.body for m in held] == [b"0", b"1", b"2", b"3"]
        await conn.close()


async def test_nack_requeue_sets_redelivered_and_reject_dead_letters(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        dlx = await ch.declare_exchange("dlx", aio_pika.ExchangeType.FANOUT)
        dead = await ch.declare_queue("dead")
        await dead.bind(dlx)
        work = await ch.declare_queue("work", arguments={"x-dead-letter-exchange": "dlx"})
        await ch.default_exchange.publish(aio_pika.Message(b"job"), "work")
        first = await get(work)
        assert not first.redelivered
        await first.nack(requeue=True)
        again = await get(work)
        assert again.body == b"job" and again.redelivered
        await again.reject(requeue=False)
        letter = await get(dead)
        assert letter.body == b"job"
        death = letter.headers["x-death"][0]
        assert death["queue"] == "work" and death["reason"] == "rejected"
        await letter.ack()
        await conn.close()


async def test_message_ttl_expires_into_dead_letter_queue(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.declare_queue("expired")
        short = await ch.declare_queue("short", arguments={
            "x-message-ttl": 200, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "expired"})
        await ch.default_exchange.publish(aio_pika.Message(b"stale"), "short")
        await ch.default_exchange.publish(aio_pika.Message(b"per-message", expiration=0.2), "expired")
        await asyncio.sleep(0.5)
        assert await short.get(fail=False) is None  # expired on the way out
        expired = await ch.get_queue("expired")
        got = await get(expired)
        # per-message expiration dropped the direct one; the dead letter from "short" arrived
        assert got.body == b"stale" and got.headers["x-death"][0]["reason"] == "expired"
        await got.ack()
        await conn.close()


async def test_max_length_drop_head_and_reject_publish(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        head = await ch.declare_queue("head", arguments={"x-max-length": 2})
        await ch.declare_queue("strict", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        for i in range(4):
            await ch.default_exchange.publish(aio_pika.Message(f"{i}".encode()), "head")
        bodies = [(await get(head)).body for _ in range(2)]
        assert bodies == [b"2", b"3"]
        await ch.default_exchange.publish(aio_pika.Message(b"fits"), "strict")
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ch.default_exchange.publish(aio_pika.Message(b"refused"), "strict")
        await conn.close()


async def test_durable_state_and_unacked_survive_restart(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.declare_exchange("orders", aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await ch.declare_queue("eu-orders", durable=True)
        await queue.bind(ex, "eu.#")
        await ch.declare_queue("temp", durable=False)
        for i in range(5):
            await ex.publish(aio_pika.Message(f"o{i}".encode(), delivery_mode=2), f"eu.{i}")
        first = await get(queue)
        await first.ack()
        await get(queue)  # delivered, not acknowledged
        await conn.close()
    async with amqp_gateway(data_dir) as (gw, url):
        assert "temp" not in gw.amqp.queues  # not durable
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        queue = await ch.declare_queue("eu-orders", durable=True, passive=True)
        ex = await ch.get_exchange("orders")
        await ex.publish(aio_pika.Message(b"after"), "eu.x")  # the binding came back too
        got = []
        for _ in range(5):
            message = await get(queue)
            got.append((message.body, message.redelivered))
            await message.ack()
        assert [b for b, _ in got] == [b"o1", b"o2", b"o3", b"o4", b"after"]
        await conn.close()


async def test_unacked_messages_come_back_when_the_channel_closes(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        queue = await ch.declare_queue("rc")
        await ch.default_exchange.publish(aio_pika.Message(b"x"), "rc")
        await get(queue)
        await ch.close()
        ch2 = await conn.channel()
        queue2 = await ch2.get_queue("rc")
        message = await get(queue2)
        assert message.body == b"x" and message.redelivered
        await conn.close()


async def test_errors_close_the_channel_with_reply_codes(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        with pytest.raises(ChannelNotFoundEntity):  # 404
            await ch.declare_queue("missing", passive=True)
        ch = await conn.channel()
        await ch.declare_queue("once", durable=True)
        with pytest.raises(ChannelPreconditionFailed):  # 406: inequivalent
            await ch.declare_queue("once", durable=False)
        ch = await conn.channel()
        with pytest.raises(ChannelClosed) as err:  # 403: reserved name
            await ch.declare_exchange("amq.mine", aio_pika.ExchangeType.DIRECT)
        assert "403" in str(err.value) or "ACCESS_REFUSED" in str(err.value)
        ch = await conn.channel()
        await ch.declare_queue("mine", exclusive=True)
        other = await aio_pika.connect(url)
        och = await other.channel()
        with pytest.raises(ChannelClosed) as err:  # 405: exclusive to another connection
            await och.declare_queue("mine", passive=True)
        assert "405" in str(err.value) or "RESOURCE_LOCKED" in str(err.value)
        ch = await conn.channel()
        queue = await ch.declare_queue("busy")
        await queue.consume(lambda m: None)
        with pytest.raises(ChannelPreconditionFailed):  # 406 if-unused
            await (await conn.channel()).queue_delete("busy", if_unused=True)
        # the connection is still usable after all these channel errors
        ch = await conn.channel()
        await ch.declare_queue("still-fine")
        await other.close()
        await conn.close()


async def test_purge_delete_and_basic_get_empty(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (gw, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        queue = await ch.declare_queue("p")
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(b"x"), "p")
        await asyncio.sleep(0.2)
        assert (await queue.declare()).message_count == 3
        assert await queue.purge() is not None
        assert await queue.get(fail=False) is None
        with pytest.raises(ChannelPreconditionFailed):
            await ch.default_exchange.publish(aio_pika.Message(b"y"), "p")
            await asyncio.sleep(0.2)
            await (await conn.channel()).queue_delete("p", if_empty=True)
        await (await conn.channel()).queue_delete("p")
        assert "p" not in gw.amqp.queues
        await conn.close()


def test_pika_blocking_client(data_dir: Path) -> None:
    import threading

    import pika

    ready = threading.Event()
    result: dict[str, Any] = {}

    async def serve(stop: asyncio.Event) -> None:
        async with amqp_gateway(data_dir) as (_, url):
            result["port"] = int(url.rsplit(":", 1)[1].strip("/"))
            ready.set()
            await stop.wait()

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(serve(stop)), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        params = pika.ConnectionParameters("127.0.0.1", result["port"], credentials=pika.PlainCredentials("guest", "guest"))
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("pika-q", durable=True)
        ch.basic_publish("", "pika-q", b"from pika", pika.BasicProperties(delivery_mode=2))
        method, _, body = None, None, None
        for _ in range(50):
            method, _, body = ch.basic_get("pika-q")
            if method is not None:
                break
            conn.sleep(0.05)
        assert body == b"from pika"
        ch.basic_ack(method.delivery_tag)
        conn.close()
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


async def raw_handshake(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    from pamqp import commands

    from protocols.amqp.frames import PROTOCOL_HEADER, method_frame

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PROTOCOL_HEADER)
    await reader.read(4096)  # connection.start
    writer.write(method_frame(0, commands.Connection.StartOk(response="\x00guest\x00guest")))
    await reader.read(4096)  # connection.tune
    writer.write(method_frame(0, commands.Connection.TuneOk(2047, 131072, 0)))
    writer.write(method_frame(0, commands.Connection.Open("/")))
    await reader.read(4096)  # connection.open-ok
    return reader, writer


async def read_frames(reader: asyncio.StreamReader) -> list:
    from pamqp import frame

    data = b""
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), TIMEOUT)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    frames = []
    while data:
        used, _, value = frame.unmarshal(data)
        frames.append(value)
        data = data[used:]
    return frames


async def test_bad_frames_close_only_that_connection(data_dir: Path) -> None:
    from pamqp import commands

    from protocols.amqp.frames import PROTOCOL_HEADER, method_frame

    async with amqp_gateway(data_dir) as (_, url):
        port = int(url.rsplit(":", 1)[1].strip("/"))
        bystander = await aio_pika.connect(url)
        # a wrong protocol header: the server answers with the one it speaks and closes
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"AMQP\x01\x01\x00\x0a")
        assert await reader.read(100) == PROTOCOL_HEADER
        assert await reader.read(100) == b""
        # a frame that does not end with 0xCE: connection.close 501
        reader, writer = await raw_handshake(port)
        writer.write(b"\x01\x00\x00\x00\x00\x00\x04\x00\x14\x00\x0a\x00")
        closes = [f for f in await read_frames(reader) if isinstance(f, commands.Connection.Close)]
        assert [c.reply_code for c in closes] == [501]
        # a method on a channel that was never opened: connection.close 504
        reader, writer = await raw_handshake(port)
        writer.write(method_frame(5, commands.Basic.Qos(prefetch_count=1)))
        closes = [f for f in await read_frames(reader) if isinstance(f, commands.Connection.Close)]
        assert [c.reply_code for c in closes] == [504]
        # garbage inside a well-framed method frame: 502 syntax error (or 501), never a crash
        reader, writer = await raw_handshake(port)
        writer.write(b"\x01\x00\x00\x00\x00\x00\x05\x00\x32\x00\x0a\xff\xce")
        closes = [f for f in await read_frames(reader) if isinstance(f, commands.Connection.Close)]
        assert len(closes) == 1 and closes[0].reply_code in (501, 502)
        ch = await bystander.channel()  # the other connection is unaffected
        await ch.declare_queue("ok")
        await bystander.close()


async def test_a_consumer_gets_every_message_of_concurrent_publishers_once_in_order(data_dir: Path) -> None:
    """Three channels publish at once into a queue a consumer reads at its end: every message
    once, each channel's in order (the newest taken as committed, store/read/tail.py)."""
    async with amqp_gateway(data_dir) as (gw, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=50)
        queue = await ch.declare_queue("fanin", durable=True)
        got: list[bytes] = []
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(message.body)
            await message.ack()
            if len(got) >= 300:
                done.set()

        await queue.consume(on_message)
        publishers = [await conn.channel(publisher_confirms=True) for _ in range(3)]

        async def publish(k: int) -> None:
            for i in range(100):
                await publishers[k].default_exchange.publish(aio_pika.Message(f"{k}:{i}".encode()), "fanin")

        await asyncio.gather(*(publish(k) for k in range(3)))
        await asyncio.wait_for(done.wait(), TIMEOUT)
        await asyncio.sleep(0.2)
        assert len(got) == 300
        for k in range(3):
            assert [b for b in got if b.startswith(f"{k}:".encode())] == [f"{k}:{i}".encode() for i in range(100)]
        assert gw.amqp.cache.stats.messages_written_through > 0
        await conn.close()
