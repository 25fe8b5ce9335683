"""RabbitMQ's optional arguments and the features behind them (issue 31): an argument is built,
a no-op that is already RabbitMQ's behaviour, or refused with 406 naming it -- never accepted and
ignored; x-delivery-limit with dead-lettering (its count kept across a restart and a crash),
consumer priorities, a message expiration RabbitMQ would refuse, direct reply-to, x-match of
headers bindings. Through aio-pika, pika and raw frames over real sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pika
import pytest
from aio_pika.exceptions import ChannelClosed, ChannelNotFoundEntity, ChannelPreconditionFailed, DeliveryError
from pamqp import commands

from protocols.amqp.frames import content_frames, method_frame

from .amqp_support import RawAMQP, port_of
from .crash_support import free_port, kill9, start_gateway, stop
from .test_amqp import amqp_gateway, get

TIMEOUT = 5.0


async def _ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    pass


@pytest.mark.parametrize(("argument", "value"), [
    ("x-queue-type", "quorum"), ("x-queue-type", "stream"), ("x-dead-letter-strategy", "at-least-once"),
    ("x-single-active-consumer", True), ("x-max-priority", 10), ("x-max-length-bytes", 1000),
    ("x-max-age", "1D"), ("x-consumer-timeout", 1000), ("x-queue-mode", "fast"), ("x-delivery-limit", "two"),
    ("x-overflow", "reject-publish-dlx"),
])
async def test_unbuilt_or_invalid_queue_arguments_are_refused_naming_them(data_dir: Path, argument: str,
                                                                          value: object) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        with pytest.raises(ChannelPreconditionFailed, match=argument):
            await (await conn.channel()).declare_queue("q", arguments={argument: value})
        with pytest.raises(ChannelNotFoundEntity):
            await (await conn.channel()).declare_queue("q", passive=True)  # never created
        await conn.close()


async def test_classic_no_op_and_unknown_queue_arguments_are_accepted(data_dir: Path) -> None:
    """x-queue-type classic is what every queue is (declared again without it: the same queue);
    lazy mode and at-most-once dead-lettering are what happens anyway; an argument RabbitMQ
    does not know is ignored, as RabbitMQ ignores it."""
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.declare_queue("classic", arguments={"x-queue-type": "classic"})
        await ch.declare_queue("classic")
        await ch.declare_queue("lazy", arguments={"x-queue-mode": "lazy", "x-dead-letter-strategy": "at-most-once",
                                                  "x-single-active-consumer": False})
        queue = await ch.declare_queue("custom", arguments={"x-my-application-tag": "blue"})
        await ch.default_exchange.publish(aio_pika.Message(b"m"), "custom")
        assert (await get(queue)).body == b"m"
        await conn.close()


@pytest.mark.parametrize(("argument", "value"), [
    ("x-stream-offset", "first"), ("x-stream-filter", "eu"), ("x-priority", "high"),
])
async def test_unbuilt_or_invalid_consumer_arguments_are_refused(data_dir: Path, argument: str,
                                                                 value: object) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        queue = await ch.declare_queue("q")
        with pytest.raises(ChannelPreconditionFailed, match=argument):
            await queue.consume(_ignore, arguments={argument: value})
        await conn.close()


async def test_a_higher_priority_consumer_takes_messages_while_it_can(data_dir: Path) -> None:
    """Two consumers with room for 3 unacknowledged messages each, one with x-priority 10: of 4
    messages the first 3 go to it, the 4th (it is full) to the other."""
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        got: dict[str, list[bytes]] = {"high": [], "low": []}
        four = asyncio.Event()

        def taker(name: str):
            async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                got[name].append(message.body)
                if sum(map(len, got.values())) == 4:
                    four.set()
            return take

        for name, priority in (("low", 0), ("high", 10)):
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=3)
            queue = await ch.declare_queue("work")
            await queue.consume(taker(name), arguments={"x-priority": priority})
        publisher = await conn.channel(publisher_confirms=True)
        for i in range(4):
            await publisher.default_exchange.publish(aio_pika.Message(str(i).encode()), "work")
        await asyncio.wait_for(four.wait(), TIMEOUT)
        assert got == {"high": [b"0", b"1", b"2"], "low": [b"3"]}
        await conn.close()


@pytest.mark.parametrize(("expiration", "error"), [
    ("abc", "no_integer"), ("-1", "{value_negative,-1}"), ("10s", '{leftover_string,"s"}'),
    ("4294967296", "{value_too_large,4294967296}"),
])
async def test_a_publish_with_an_invalid_expiration_is_refused(data_dir: Path, expiration: str, error: str) -> None:
    """As RabbitMQ: its channel is closed with 406 ``invalid expiration '...': ...``; nothing is
    stored. A valid one on another channel is stored."""
    async with amqp_gateway(data_dir) as (gw, url):
        raw = await RawAMQP.open(port_of(url))
        raw.writer.write(method_frame(1, commands.Channel.Open()) + method_frame(2, commands.Channel.Open())
                         + method_frame(1, commands.Queue.Declare(queue="ttl")))
        await raw.until(commands.Queue.DeclareOk)

        def publish(channel: int, value: str) -> bytes:
            return content_frames(channel, commands.Basic.Publish(exchange="", routing_key="ttl"),
                                  commands.Basic.Properties(expiration=value), b"m", 131_072)
        raw.writer.write(publish(1, expiration) + publish(2, "60000"))
        close = (await raw.until(commands.Channel.Close))[-1]
        assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 40)
        assert close.reply_text == f"PRECONDITION_FAILED - invalid expiration '{expiration}': {error}"
        raw.writer.write(method_frame(1, commands.Channel.CloseOk()) + method_frame(2, commands.Basic.Get(queue="ttl")))
        got = await raw.until(commands.Basic.GetOk)
        assert got[-1].message_count == 0  # the valid one, alone
        raw.writer.close()


async def _poison_queue(ch: aio_pika.abc.AbstractChannel, name: str, limit: int, *, durable: bool = False
                        ) -> tuple[aio_pika.abc.AbstractQueue, aio_pika.abc.AbstractQueue]:
    dlx = await ch.declare_exchange(f"{name}-dlx", aio_pika.ExchangeType.FANOUT, durable=durable)
    dead = await ch.declare_queue(f"{name}-dead", durable=durable)
    await dead.bind(dlx)
    work = await ch.declare_queue(name, durable=durable, arguments={
        "x-delivery-limit": limit, "x-dead-letter-exchange": f"{name}-dlx"})
    return work, dead


async def test_a_message_given_back_more_than_the_delivery_limit_is_dead_lettered(data_dir: Path) -> None:
    """x-delivery-limit 2, as a quorum queue's: given back by nack, reject and a closed channel
    (3 times, more than 2), the message is dead-lettered with reason delivery_limit after its
    3rd delivery; a redelivery carries the count so far in header x-delivery-count; a queue
    without a dead-letter exchange drops it."""
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        work, dead = await _poison_queue(await conn.channel(), "work", 2)
        await work.channel.default_exchange.publish(aio_pika.Message(b"poison", headers={"k": "v"}), "work")
        first = await get(work)
        assert "x-delivery-count" not in first.headers
        await first.nack(requeue=True)
        await (await get(work)).reject(requeue=True)
        ch = await conn.channel()
        third = await get(await ch.declare_queue("work", passive=True))
        assert third.redelivered and third.headers == {"k": "v", "x-delivery-count": 2}
        await ch.close()  # unacknowledged: given back a third time
        death = await get(dead)
        assert death.body == b"poison"
        assert [(d["queue"], d["reason"], d["count"]) for d in death.headers["x-death"]] == [
            ("work", "delivery_limit", 1)]
        assert await work.get(fail=False) is None
        plain = await work.channel.declare_queue("plain", arguments={"x-delivery-limit": 0})
        await work.channel.default_exchange.publish(aio_pika.Message(b"once"), "plain")
        await (await get(plain)).nack(requeue=True)
        assert await plain.get(fail=False) is None
        await conn.close()


async def test_a_delivery_count_survives_a_restart(data_dir: Path) -> None:
    """Given back once before a restart and once after, with x-delivery-limit 1: dead-lettered."""
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        work, _ = await _poison_queue(ch, "work", 1, durable=True)
        await ch.default_exchange.publish(aio_pika.Message(b"poison", delivery_mode=2), "work")
        await (await get(work)).nack(requeue=True)
        await conn.close()
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        work = await ch.declare_queue("work", passive=True)
        again = await get(work)
        assert again.headers["x-delivery-count"] == 1
        await again.nack(requeue=True)
        assert await work.get(fail=False) is None
        assert (await get(await ch.declare_queue("work-dead", passive=True))).body == b"poison"
        await conn.close()


def _give_back_once(url: str, *, declare: bool) -> bool:
    """basic.get from "work" and nack with requeue (True), or find it empty (False)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    if declare:
        ch.confirm_delivery()
        ch.exchange_declare("work-dlx", "fanout", durable=True)
        ch.queue_declare("work-dead", durable=True)
        ch.queue_bind("work-dead", "work-dlx")
        ch.queue_declare("work", durable=True, arguments={"x-delivery-limit": 1, "x-dead-letter-exchange": "work-dlx"})
        ch.basic_publish("", "work", b"poison", pika.BasicProperties(delivery_mode=2))
    method, _, _ = ch.basic_get("work", auto_ack=False)
    if method is not None:
        ch.basic_nack(method.delivery_tag, requeue=True)
        ch.queue_declare("work", passive=True)  # (a round trip: the nack was handled)
    conn.close()
    return method is not None


@pytest.mark.slow
async def test_a_delivery_count_survives_a_crash(tmp_path: Path) -> None:
    """As above, with ``kill -9`` in between: the count was written when the message was given back."""
    data_dir, port = tmp_path / "data", free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        assert await asyncio.to_thread(_give_back_once, url, declare=True)
    finally:
        kill9(proc)
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        assert await asyncio.to_thread(_give_back_once, url, declare=False)  # the second time: over the limit
        assert not await asyncio.to_thread(_give_back_once, url, declare=False)
        conn = await aio_pika.connect(url)
        dead = await (await conn.channel()).declare_queue("work-dead", passive=True)
        assert (await get(dead)).body == b"poison"
        await conn.close()
    finally:
        stop(proc)


async def test_direct_reply_to_reaches_the_requesting_channel(data_dir: Path) -> None:
    """The RPC pattern of RabbitMQ's direct reply-to: the client consumes amq.rabbitmq.reply-to
    (no-ack), publishes a request with reply-to amq.rabbitmq.reply-to; the server sees a name of
    its own and publishes the reply there through the default exchange. Once the client's
    channel is gone, a mandatory reply is returned (312)."""
    async with amqp_gateway(data_dir) as (_, url):
        server = await aio_pika.connect(url)
        server_ch = await server.channel()
        requests = await server_ch.declare_queue("rpc")

        async def answer(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                assert message.reply_to and message.reply_to.startswith("amq.rabbitmq.reply-to.")
                await server_ch.default_exchange.publish(
                    aio_pika.Message(b"re: " + message.body, correlation_id=message.correlation_id), message.reply_to)
        await requests.consume(answer)
        client = await aio_pika.connect(url)
        ch = await client.channel()
        replies = await ch.declare_queue("amq.rabbitmq.reply-to", passive=True)
        got: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await replies.consume(got.put, no_ack=True)
        await ch.default_exchange.publish(
            aio_pika.Message(b"ping", reply_to="amq.rabbitmq.reply-to", correlation_id="1"), "rpc")
        reply = await asyncio.wait_for(got.get(), TIMEOUT)
        assert (reply.body, reply.correlation_id) == (b"re: ping", "1")
        await ch.close()  # a reply to a channel that is gone: lost, or returned if mandatory
        late = await server.channel(publisher_confirms=True, on_return_raises=True)
        with pytest.raises(DeliveryError) as returned:
            await late.default_exchange.publish(aio_pika.Message(b"late"), reply.routing_key, mandatory=True)
        assert returned.value.frame is not None and returned.value.frame.reply_code == 312
        await client.close()
        await server.close()


async def test_direct_reply_to_refuses_what_rabbitmq_refuses(data_dir: Path) -> None:
    """A request with reply-to amq.rabbitmq.reply-to from a channel not consuming it, and a
    reply consumer that would acknowledge: 406, as RabbitMQ."""
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel(publisher_confirms=False)
        await ch.declare_queue("rpc")
        await ch.default_exchange.publish(aio_pika.Message(b"ping", reply_to="amq.rabbitmq.reply-to"), "rpc")
        with pytest.raises(ChannelClosed, match="fast reply consumer does not exist"):
            await ch.declare_queue("rpc", passive=True)
        ch = await conn.channel()
        replies = await ch.declare_queue("amq.rabbitmq.reply-to", passive=True)
        with pytest.raises(ChannelPreconditionFailed, match="reply consumer cannot acknowledge"):
            await replies.consume(_ignore, no_ack=False)
        await conn.close()


async def test_headers_bindings_match_as_rabbitmq_says_or_are_refused(data_dir: Path) -> None:
    """x-match any-with-x / all-with-x match the binding's x- arguments too (plain any / all
    leave them out); an x-match RabbitMQ does not know is refused (406) rather than read as all."""
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        headers = await ch.declare_exchange("h", aio_pika.ExchangeType.HEADERS)
        with_x = await ch.declare_queue("with-x")
        await with_x.bind(headers, arguments={"x-match": "any-with-x", "x-tenant": "blue"})
        plain = await ch.declare_queue("plain")
        await plain.bind(headers, arguments={"x-match": "all", "x-tenant": "blue"})  # (no other key: all match)
        await headers.publish(aio_pika.Message(b"blue", headers={"x-tenant": "blue"}), "")
        await headers.publish(aio_pika.Message(b"red", headers={"x-tenant": "red"}), "")
        assert (await get(with_x)).body == b"blue"
        assert await with_x.get(fail=False) is None
        assert [(await get(plain)).body, (await get(plain)).body] == [b"blue", b"red"]
        with pytest.raises(ChannelPreconditionFailed, match="x-match"):
            await plain.bind(headers, arguments={"x-match": "some"})
        await conn.close()


async def test_a_queue_or_exchange_name_with_a_nul_is_refused(data_dir: Path) -> None:
    """A NUL in a name would make the store keys of one queue (its consumer offset, its delivery
    counts) read as another's -- ``work`` and ``work\\x00x`` -- so it is refused, 406 naming it;
    nothing is created. (pika sends any name; aio-pika refuses it itself.)"""
    def run(url: str) -> list[tuple[int, str]]:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare("work", arguments={"x-delivery-limit": 1})
        closes = []
        for call in (lambda ch: ch.queue_declare("work\x00x", arguments={"x-delivery-limit": 1}),
                     lambda ch: ch.queue_declare("work\x00x", passive=True),
                     lambda ch: ch.exchange_declare("x\x00y", "fanout"),
                     lambda ch: ch.exchange_declare("x\x00y", "fanout", passive=True)):
            try:
                call(conn.channel())
                closes.append((0, ""))
            except pika.exceptions.ChannelClosedByBroker as exc:
                closes.append((exc.reply_code, exc.reply_text))
        conn.close()
        return closes

    async with amqp_gateway(data_dir) as (_, url):
        closes = await asyncio.to_thread(run, url)
    assert [code for code, _ in closes] == [406, 404, 406, 404], closes
    assert "NUL" in closes[0][1] and "NUL" in closes[2][1]
