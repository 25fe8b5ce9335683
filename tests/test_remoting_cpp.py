"""The remoting gateway through RocketMQ's C++ client (PyPI ``rocketmq==0.4.4``, which bundles
librocketmq): SEND_MESSAGE with full header names and UNIQ_KEY, batch send, push consumers of
one group sharing the queues, the pull consumer, offsets across a restart, retry then DLQ, tag
filter. (Its C API has no query-by-key call; the ali-ons tests cover QUERY_MESSAGE.)"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rocketmq import client as rmq

from tests.remoting_support import remoting_gateway

TIMEOUT = 20.0


pytestmark = pytest.mark.usefixtures("rocketmq_home")


class StatusPushConsumer(rmq.PushConsumer):
    """The wrapper's own subscribe() cannot ask for a retry (an exception escapes the ctypes
    callback and counts as success); this one returns librocketmq's RECONSUME_LATER when the
    callback returns False, so the C++ client's own send-back does the retry."""

    def subscribe(self, topic: str, callback: Callable[[rmq.RecvMessage], bool], expression: str = "*") -> None:
        def on_message(consumer, msg):  # noqa: ARG001
            ok = callback(rmq.RecvMessage(msg))
            return (rmq._CConsumeStatus.CONSUME_SUCCESS if ok is not False
                    else rmq._CConsumeStatus.RECONSUME_LATER).value

        rmq.ffi_check(rmq.dll.Subscribe(self._handle, rmq._to_bytes(topic), rmq._to_bytes(expression)))
        self._register_callback(on_message)


class Received:
    def __init__(self) -> None:
        self.items: queue.Queue[dict] = queue.Queue()

    def record(self, consumer: str) -> Callable[[rmq.RecvMessage], bool]:
        def callback(msg: rmq.RecvMessage) -> bool:
            self.items.put({"consumer": consumer, "body": msg.body.decode(), "tags": msg.tags.decode(),
                            "keys": msg.keys.decode(), "id": msg.id, "queue_id": msg.queue_id,
                            "reconsume": msg.reconsume_times, "topic": msg.topic})
            return True
        return callback

    async def take(self, count: int, timeout: float = TIMEOUT) -> list[dict]:
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"received {len(got)} of {count}: {got}")
            try:
                got.append(await asyncio.to_thread(self.items.get, True, min(left, 0.5)))
            except queue.Empty:
                continue
        return got

    async def nothing_more(self, wait: float = 1.0) -> None:
        await asyncio.sleep(wait)
        assert self.items.empty(), f"unexpected {self.items.get_nowait()}"


async def producer(addr: str, group: str = "PID-cpp") -> rmq.Producer:
    p = rmq.Producer(group)
    p.set_namesrv_addr(addr)
    await asyncio.to_thread(p.start)
    return p


async def push_consumer(addr: str, group: str, topic: str, callback, expression: str = "*",
                        instance: str = "c1") -> rmq.PushConsumer:
    c = StatusPushConsumer(group)
    c.set_namesrv_addr(addr)
    c.set_instance_name(instance)
    c.subscribe(topic, callback, expression)
    await asyncio.to_thread(c.start)
    return c


def message(topic: str, body: str, tags: str = "", keys: str = "") -> rmq.Message:
    m = rmq.Message(topic)
    m.set_body(body)
    if tags:
        m.set_tags(tags)
    if keys:
        m.set_keys(keys)
    return m


async def test_send_and_push_consume_with_tag_filter(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        p = await producer(addr)
        results = []
        for body, tags in (("a", "TagA"), ("b", "TagB"), ("c", "TagA")):
            results.append(await asyncio.to_thread(p.send_sync, message("CppOrders", body, tags, f"key-{body}")))
        assert [r.status for r in results] == [rmq.SendStatus.OK] * 3
        received = Received()
        c = await push_consumer(addr, "CID-tags", "CppOrders", received.record("c1"), "TagA")
        try:
            got = await received.take(2)
            await received.nothing_more()
        finally:
            await asyncio.to_thread(c.shutdown)
            await asyncio.to_thread(p.shutdown)
        assert sorted(m["body"] for m in got) == ["a", "c"]
        first = next(m for m in got if m["body"] == "a")
        assert first["tags"] == "TagA" and first["keys"] == "key-a"
        assert first["id"] == results[0].msg_id  # the client's UNIQ_KEY comes back as the id


async def test_batch_send(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        p = await producer(addr)
        messages = [message("CppBatch", f"b{i}", "T", f"bk{i}") for i in range(5)]
        result = await asyncio.to_thread(p.send_batch, messages)
        assert result.status == rmq.SendStatus.OK
        received = Received()
        c = await push_consumer(addr, "CID-batch", "CppBatch", received.record("c1"))
        try:
            got = await received.take(5)
        finally:
            await asyncio.to_thread(c.shutdown)
            await asyncio.to_thread(p.shutdown)
        assert sorted(m["body"] for m in got) == [f"b{i}" for i in range(5)]
        assert len({m["queue_id"] for m in got}) == 1  # one batch, one queue


async def test_two_push_consumers_of_one_group_share_the_queues(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        received = Received()
        one = await push_consumer(addr, "CID-shared", "CppShared", received.record("c1"), instance="c1")
        two = await push_consumer(addr, "CID-shared", "CppShared", received.record("c2"), instance="c2")
        p = await producer(addr)
        try:
            await asyncio.sleep(3.0)  # both registered; the notify makes both rebalance
            for i in range(40):
                await asyncio.to_thread(p.send_sync, message("CppShared", f"m{i}"))
            got = await received.take(40)
            await received.nothing_more()
        finally:
            for client in (one, two, p):
                await asyncio.to_thread(client.shutdown)
        assert sorted(m["body"] for m in got) == sorted(f"m{i}" for i in range(40))
        queues = {name: {m["queue_id"] for m in got if m["consumer"] == name} for name in ("c1", "c2")}
        assert queues["c1"] and queues["c2"] and not queues["c1"] & queues["c2"]


async def test_pull_consumer_reads_every_queue(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        p = await producer(addr)
        for i in range(10):
            await asyncio.to_thread(p.send_sync, message("CppPull", f"p{i}", "T"))
        await asyncio.to_thread(p.shutdown)
        consumer = rmq.PullConsumer("CID-pull")
        consumer.set_namesrv_addr(addr)
        await asyncio.to_thread(consumer.start)
        try:
            bodies = await asyncio.to_thread(lambda: [m.body.decode() for m in consumer.pull("CppPull")])
        finally:
            await asyncio.to_thread(consumer.shutdown)
        assert sorted(bodies) == sorted(f"p{i}" for i in range(10))


async def test_offsets_survive_a_restart(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        p = await producer(addr)
        for i in range(6):
            await asyncio.to_thread(p.send_sync, message("CppDurable", f"a{i}"))
        received = Received()
        c = await push_consumer(addr, "CID-durable", "CppDurable", received.record("c1"))
        await received.take(6)
        await asyncio.sleep(1.0)  # the client persists its offsets every few seconds, and on shutdown
        await asyncio.to_thread(c.shutdown)
        await asyncio.to_thread(p.shutdown)
    async with remoting_gateway(data_dir) as (_, addr):
        p = await producer(addr)
        for i in range(3):
            await asyncio.to_thread(p.send_sync, message("CppDurable", f"b{i}"))
        received = Received()
        c = await push_consumer(addr, "CID-durable", "CppDurable", received.record("c1"))
        try:
            got = await received.take(3)
            await received.nothing_more(2.0)
        finally:
            await asyncio.to_thread(c.shutdown)
            await asyncio.to_thread(p.shutdown)
        assert sorted(m["body"] for m in got) == ["b0", "b1", "b2"]


async def test_retry_then_dead_letter_queue(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        p = await producer(addr)
        await asyncio.to_thread(p.send_sync, message("CppFlaky", "poison"))
        seen: queue.Queue[int] = queue.Queue()

        def always_fails(msg: rmq.RecvMessage) -> bool:
            seen.put(msg.reconsume_times)
            return False

        c = await push_consumer(addr, "CID-flaky", "CppFlaky", always_fails)
        dead = Received()
        reader = await push_consumer(addr, "CID-dlq-reader", "%DLQ%CID-flaky", dead.record("dlq"))
        try:
            got = await dead.take(1, timeout=40.0)
        finally:
            for client in (c, reader, p):
                await asyncio.to_thread(client.shutdown)
        attempts = []
        while not seen.empty():
            attempts.append(seen.get_nowait())
        assert got[0]["body"] == "poison"
        assert attempts[:3] == [0, 1, 2] and max(attempts) == 16  # the client's default maxReconsumeTimes
