"""What an AMQP queue promises, through pika against real gateways: a confirmed message is
delivered after any crash, even on a queue declared a moment before; a message published while
a queue has no consumer reaches the next one; a channel reads its own writes; a non-durable
queue declared again after a restart starts empty."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pika
import pytest

from .crash_support import free_port, kill9, start_gateway
from .test_amqp import amqp_gateway


def blocking(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def drain(url: str, queue: str, *, limit: int = 100_000) -> list[bytes]:
    """Every message basic.get finds in ``queue`` (acknowledged), in order."""
    conn = blocking(url)
    ch = conn.channel()
    ch.queue_declare(queue, passive=True)
    bodies = []
    for _ in range(limit):
        method, _, body = ch.basic_get(queue)
        if method is None:
            break
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
    conn.close()
    return bodies


def publish_confirmed(url: str, queue: str, count: int) -> None:
    """Declare a durable queue and publish ``count`` persistent messages with confirms (pika's
    blocking channel returns from basic_publish only once the message is confirmed)."""
    conn = blocking(url)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(count):
        ch.basic_publish("", queue, str(i).encode(), persistent, mandatory=True)
    conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("flush", ["sync", "async"])
async def test_confirmed_messages_of_a_queue_declared_just_before_survive_kill_9(tmp_path: Path,
                                                                                  flush: str) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_gateway(data_dir, amqp_port=port, flush=flush)
    try:
        await asyncio.to_thread(publish_confirmed, url, "orders", 1000)
    finally:
        kill9(proc)  # at once: well within the 5 s offset checkpoint
    proc = start_gateway(data_dir, amqp_port=port, flush=flush)
    try:
        bodies = await asyncio.to_thread(drain, url, "orders")
    finally:
        kill9(proc)
    assert [int(b) for b in bodies] == list(range(1000))


async def test_a_message_published_while_nobody_consumes_reaches_the_next_consumer(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        def scenario() -> tuple[bytes | None, bytes | None]:
            conn = blocking(url)
            ch = conn.channel()
            ch.queue_declare("tasks", durable=True)
            ch.confirm_delivery()
            got: list[bytes] = []
            tag = ch.basic_consume("tasks", lambda c, m, p, body: (got.append(body), c.basic_ack(m.delivery_tag)))
            ch.basic_publish("", "tasks", b"m1")
            conn.process_data_events(time_limit=0)
            for _ in range(50):
                if got:
                    break
                conn.process_data_events(time_limit=0.1)
            assert got == [b"m1"]
            ch.basic_cancel(tag)
            ch.basic_publish("", "tasks", b"m2")  # confirmed: stored, with no consumer attached
            late: list[bytes] = []
            ch.basic_consume("tasks", lambda c, m, p, body: (late.append(body), c.basic_ack(m.delivery_tag)))
            for _ in range(50):
                if late:
                    break
                conn.process_data_events(time_limit=0.1)
            first = late[0] if late else None
            ch.basic_publish("", "tasks", b"m3")
            ch.close()
            ch = conn.channel()  # no consumer now: basic.get must find m3
            method, _, body = ch.basic_get("tasks", auto_ack=True)
            conn.close()
            return first, body if method is not None else None

        assert await asyncio.to_thread(scenario) == (b"m2", b"m3")


async def test_a_channel_reads_its_own_writes(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        def scenario() -> int:
            conn = blocking(url)
            ch = conn.channel()
            ch.queue_declare("ryw")
            found = 0
            for i in range(50):
                ch.basic_publish("", "ryw", str(i).encode())  # no confirms: basic.get follows at once
                method, _, body = ch.basic_get("ryw", auto_ack=True)
                found += method is not None and body == str(i).encode()
            declared = ch.queue_declare("ryw", passive=True).method.message_count
            ch.basic_publish("", "ryw", b"counted")
            counted = ch.queue_declare("ryw", passive=True).method.message_count
            conn.close()
            assert (declared, counted) == (0, 1)
            return found

        assert await asyncio.to_thread(scenario) == 50


@pytest.mark.parametrize("restart", ["stop", "kill -9"])
async def test_a_non_durable_queue_declared_again_after_a_restart_is_empty(tmp_path: Path, restart: str) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"

    def fill() -> None:
        conn = blocking(url)
        ch = conn.channel()
        ch.queue_declare("transient", durable=False)
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", "transient", str(i).encode())
        conn.close()

    def declare_again() -> tuple[int, bool]:
        conn = blocking(url)
        ch = conn.channel()
        count = ch.queue_declare("transient", durable=False).method.message_count
        method, _, _ = ch.basic_get("transient")
        conn.close()
        return count, method is None

    proc = start_gateway(data_dir, amqp_port=port)
    try:
        await asyncio.to_thread(fill)
        await asyncio.sleep(6 if restart == "kill -9" else 0)  # past the 5 s offset checkpoint
    finally:
        if restart == "stop":
            proc.terminate()
            proc.wait(20)
        kill9(proc)
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        assert await asyncio.to_thread(declare_again) == (0, True)
    finally:
        kill9(proc)


async def test_a_consumer_with_room_gets_a_burst_before_x_max_length_drops_the_head(tmp_path: Path) -> None:
    """x-max-length bounds the messages *waiting* in a queue (as RabbitMQ): a burst much larger
    than it, read and stored together, goes to the consumer that has room, not to the drop-head."""
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_gateway(tmp_path / "data", amqp_port=port, flush="async")
    try:
        got: list[bytes] = []

        async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(message.body)

        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        queue = await ch.declare_queue("bounded", arguments={"x-max-length": 100})
        await queue.consume(take, no_ack=True)
        publishers = [await aio_pika.connect(url) for _ in range(4)]
        channels = [await p.channel(publisher_confirms=False) for p in publishers]
        await asyncio.gather(*(c.default_exchange.publish(aio_pika.Message(b"%d" % i), "bounded")
                               for c in channels for i in range(5000)))
        for _ in range(200):
            if len(got) == 20_000:
                break
            await asyncio.sleep(0.05)
        for p in publishers:
            await p.close()
        await conn.close()
    finally:
        kill9(proc)
    assert len(got) == 20_000
