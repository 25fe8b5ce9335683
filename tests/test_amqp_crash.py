"""Crash safety of AMQP publisher confirms through a real gateway process: ``kill -9`` at a
random moment under load from several publishers that keep declaring new durable queues, and
right after the first confirm on a queue declared a moment before. Every confirmed message is
delivered after the restart; duplicates (a confirm lost with the crash, then a redelivery) are
counted, never a loss."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest

from .crash_support import free_port, kill9, seeded_random, start_gateway, stop
from .test_amqp_guarantees import blocking, drain

PUBLISHERS = 4
QUEUE_EVERY = 150  # a publisher declares a new queue every this many messages
WINDOW = 32  # publishes a publisher has awaiting their confirms


async def publish_until_killed(url: str, publisher: int, confirmed: dict[str, list[int]],
                               declared: list[str]) -> None:
    """Publish persistent messages with confirms, WINDOW at a time, into a new durable queue every
    QUEUE_EVERY messages; record what was confirmed, until the connection dies."""
    try:
        conn = await aio_pika.connect(url)
        channel = await conn.channel(publisher_confirms=True)
        n = 0
        while True:
            name = f"load-{publisher}-{n // QUEUE_EVERY}"
            await channel.declare_queue(name, durable=True)
            declared.append(name)
            for start in range(n, n + QUEUE_EVERY, WINDOW):
                numbers = range(start, min(start + WINDOW, n + QUEUE_EVERY))
                results = await asyncio.gather(
                    *(channel.default_exchange.publish(
                        aio_pika.Message(str(i).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT), name)
                      for i in numbers),
                    return_exceptions=True)
                for i, result in zip(numbers, results):
                    if not isinstance(result, BaseException):
                        confirmed.setdefault(name, []).append(i)
                if any(isinstance(result, BaseException) for result in results):
                    return
            n += QUEUE_EVERY
    except (aio_pika.exceptions.AMQPError, ConnectionError, OSError, asyncio.CancelledError):
        return


@pytest.mark.slow
@pytest.mark.parametrize("flush", ["sync", "async"])
async def test_confirmed_messages_survive_kill_9_at_a_random_moment_under_load(tmp_path: Path, flush: str) -> None:
    moment = seeded_random("amqp random kill").uniform(0.3, 2.5)
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_gateway(data_dir, amqp_port=port, flush=flush)
    confirmed: dict[str, list[int]] = {}
    declared: list[str] = []
    try:
        tasks = [asyncio.create_task(publish_until_killed(url, p, confirmed, declared)) for p in range(PUBLISHERS)]
        await asyncio.sleep(moment)
        kill9(proc)
        _, hanging = await asyncio.wait(tasks, timeout=5)  # a client may wait on a dead socket
        for task in hanging:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        kill9(proc)
    total = sum(len(numbers) for numbers in confirmed.values())
    assert total > 100, "the crash came too early to prove anything (see CRASH_SEED above)"

    proc = start_gateway(data_dir, amqp_port=port, flush=flush)
    try:
        lost = duplicates = 0
        for name, numbers in confirmed.items():
            delivered = Counter(int(body) for body in await asyncio.to_thread(drain, url, name))
            lost += sum(1 for i in numbers if not delivered[i])
            duplicates += sum(count - 1 for count in delivered.values())
    finally:
        kill9(proc)
    print(f"moment={moment:.2f}s queues={len(declared)} confirmed={total} lost={lost} "
          f"duplicates={duplicates}")
    assert lost == 0, f"{lost} of {total} confirmed messages lost (see CRASH_SEED above)"


@pytest.mark.slow
async def test_the_first_confirm_on_a_queue_declared_a_moment_before_survives_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        conn = await aio_pika.connect(url)
        channel = await conn.channel(publisher_confirms=True)
        await channel.declare_queue("fresh", durable=True)
        await channel.default_exchange.publish(
            aio_pika.Message(b"first", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "fresh")
    finally:
        kill9(proc)  # the moment the confirm arrived
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        assert await asyncio.to_thread(drain, url, "fresh") == [b"first"]
    finally:
        kill9(proc)


@pytest.mark.slow
@pytest.mark.parametrize("end", ["kill -9", "stop"])
async def test_a_message_delivered_before_a_restart_comes_back_marked_redelivered(tmp_path: Path, end: str) -> None:
    """Messages a consumer got and did not acknowledge before the gateway went (``kill -9`` or a
    graceful stop) are delivered again after the restart with ``redelivered`` set -- the hint
    a consumer has that it may have seen them (AMQP 0-9-1 basic.deliver), as RabbitMQ sets it;
    after a graceful stop the ones it never got come without it."""
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        conn, channel = await filled_queue(url, "seen", 6)
        for _ in range(3):  # taken, not acknowledged
            method, _, body = channel.basic_get("seen", auto_ack=False)
            assert method is not None and not method.redelivered
    finally:
        if end == "stop":
            stop(proc)
        kill9(proc)
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        conn = await asyncio.to_thread(blocking, url)
        channel = conn.channel()
        got = []
        for _ in range(6):
            method, _, body = channel.basic_get("seen", auto_ack=True)
            assert method is not None
            got.append((int(body), method.redelivered))
        conn.close()
        assert [number for number, _ in got] == list(range(6))
        assert [flag for _, flag in got[:3]] == [True] * 3
        if end == "stop":  # (after a crash, what was not delivered may carry the hint too)
            assert [flag for _, flag in got[3:]] == [False] * 3
    finally:
        stop(proc)


@pytest.mark.slow
async def test_a_consumers_unacked_deliveries_survive_kill_9(tmp_path: Path) -> None:
    """A consumer of a filled queue (prefetch 100) acknowledges the first half, some one by one
    and some with ``multiple``, and holds the rest unacknowledged when the gateway is killed:
    after the restart every unacknowledged message comes again, once. (Acknowledged ones may
    come again too: with ``flush = "sync"`` the queue's offset is written at the store's offset
    checkpoint.)"""
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        conn, channel = await filled_queue(url, "filled", 300)
        channel.basic_qos(prefetch_count=100)
        acked: list[int] = []
        for method, _, body in channel.consume("filled", inactivity_timeout=5):
            assert method is not None, "deliveries stopped"
            number = int(body)
            if number < 100:
                channel.basic_ack(method.delivery_tag)  # one by one
                acked.append(number)
            elif number % 25 == 24 and number < 150:
                channel.basic_ack(method.delivery_tag, multiple=True)  # every 25
                acked.extend(range(number - 24, number + 1))
            if number == 199:
                break
        conn.process_data_events(time_limit=0.5)  # the acks are out; the broker has read them
    finally:
        kill9(proc)
    proc = start_gateway(data_dir, amqp_port=port)
    try:
        again = [int(body) for body in await asyncio.to_thread(drain, url, "filled")]
    finally:
        kill9(proc)
    assert acked == list(range(150))
    assert len(again) == len(set(again)) and set(range(150, 300)) <= set(again) <= set(range(300))


@pytest.mark.slow
async def test_acknowledged_deliveries_do_not_come_again_after_kill_9(tmp_path: Path) -> None:
    """``flush = "async"`` (the default): a consumer's acknowledgements are written within a
    moment (store.py ``OFFSETS_SOON_S``), not at the next offset checkpoint seconds later, so
    after ``kill -9`` what it acknowledged before that moment does not come again; what it held
    unacknowledged does, once."""
    data_dir = tmp_path / "data"
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_gateway(data_dir, amqp_port=port, flush="async")
    try:
        conn, channel = await filled_queue(url, "acked", 200)
        channel.basic_qos(prefetch_count=50)
        for method, _, body in channel.consume("acked", inactivity_timeout=5):
            assert method is not None, "deliveries stopped"
            if int(body) < 120:
                channel.basic_ack(method.delivery_tag)
            if int(body) == 139:
                break
        conn.process_data_events(time_limit=0.5)  # the acks are out
        await asyncio.sleep(0.5)  # (read and written meanwhile: ten times OFFSETS_SOON_S)
    finally:
        kill9(proc)
    proc = start_gateway(data_dir, amqp_port=port, flush="async")
    try:
        again = [int(body) for body in await asyncio.to_thread(drain, url, "acked")]
    finally:
        kill9(proc)
    assert sorted(again) == list(range(120, 200)), f"came again: {sorted(set(again) - set(range(120, 200)))[:10]}"


async def filled_queue(url: str, queue: str, count: int) -> tuple[pika.BlockingConnection, Any]:
    """A pika connection and a confirming channel, with the durable ``queue`` declared and
    holding ``count`` persistent messages, the numbers 0 to count - 1."""
    conn = await asyncio.to_thread(blocking, url)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for i in range(count):
        channel.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    return conn, channel
