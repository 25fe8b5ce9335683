"""Through real clients: a delivery is written to its consumer's socket in the loop turn that
commits its message, before anything that commit scheduled for later turns (the fdatasync
request, the publisher's acknowledgement, other connections' reads) runs. The probe is a
callback scheduled as the commit begins: it must find the delivery made and written. In sync
flush mode the commit's fdatasync is asked for in that turn too, once the delivery is written
(the woken flusher thread does not take the CPU from it; the confirm waits for it). Nor does
the commit leave a write for a later turn, nor an ack a pump that finds nothing to deliver. A
lone publish to an idle store is committed, and delivered, in the turn that read it: a probe
scheduled as that read begins finds the delivery made and written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aio_pika
import pytest

from gateway.amqp.broker import AMQPBroker
from gateway.amqp.connection import AMQPConnection
from gateway.mqtt.connection import MQTTConnection
from gateway.amqp.queues import QueueRuntime
from store.write.committer import GroupCommitter
from store.write.durable import SyncFlusher

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .test_amqp import amqp_gateway, publisher_and_consumer

TIMEOUT = 5.0
BODY = b"in-its-turn"


def probe_commits(monkeypatch: pytest.MonkeyPatch, look: Callable[[], tuple[object, ...]]
                  ) -> list[tuple[object, ...]]:
    """From now on, each commit of a batch holding ``BODY`` schedules, as it begins, a callback
    that records ``look()`` (deliveries made, all written) on the next loop turn."""
    seen: list[tuple[object, ...]] = []
    real_commit = GroupCommitter._commit

    def commit(self: GroupCommitter, batch):  # type: ignore[no-untyped-def]
        if any(p.body == BODY for prepared, _ in batch for p in prepared):
            asyncio.get_running_loop().call_soon(lambda: seen.append(look()))
        return real_commit(self, batch)

    monkeypatch.setattr(GroupCommitter, "_commit", commit)
    return seen


def probe_reads(monkeypatch: pytest.MonkeyPatch, protocol: type, look: Callable[[], tuple[object, ...]]
                ) -> list[tuple[object, ...]]:
    """From now on, each read of ``protocol``'s connections that holds ``BODY`` schedules, as it
    begins, a callback that records ``look()`` on the next loop turn."""
    seen: list[tuple[object, ...]] = []
    real_received = protocol.data_received

    def data_received(self, data: bytes) -> None:  # type: ignore[no-untyped-def]
        if BODY in data:
            asyncio.get_running_loop().call_soon(lambda: seen.append(look()))
        real_received(self, data)

    monkeypatch.setattr(protocol, "data_received", data_received)
    return seen


async def one_mqtt_delivery(data_dir: Path, flush: str, topic: str,
                            probe: Callable[[Callable[[], tuple[object, ...]]], list[tuple[object, ...]]]
                            ) -> list[tuple[object, ...]]:
    """One QoS 1 publish from a paho client to another's subscription, with ``probe(look)`` set
    up before it (``look``: deliveries made, all written); what the probe saw."""
    async with running_gateway(data_dir, flush=flush) as gw:
        mqtt = gw.mqtt
        assert mqtt is not None
        port = mqtt_port(gw)
        subscriber = PahoClient(port, "sub")
        publisher = PahoClient(port, "pub")
        await subscriber.connect()
        await publisher.connect()
        try:
            await subscriber.subscribe(topic, qos=1)
            seen = probe(lambda: (mqtt.stats.messages_sent, not any(c.out for c in mqtt.connections.values())))
            info = publisher.client.publish(topic, BODY, qos=1)
            (received,) = await subscriber.receive(1)
            assert received.payload == BODY
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
            return seen
        finally:
            await subscriber.disconnect()
            await publisher.disconnect()


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_a_lone_amqp_publish_to_an_idle_store_is_delivered_in_the_turn_that_read_it(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, flush: str) -> None:
    async with amqp_gateway(data_dir, flush=flush) as (gw, url):
        amqp = gw.amqp
        assert amqp is not None
        async with publisher_and_consumer(url, "read-turn") as (pub, got):
            seen = probe_reads(monkeypatch, AMQPConnection, lambda: (
                amqp.stats.messages_sent, not any(c._out for c in amqp.connections)))
            for i in range(3):
                await asyncio.wait_for(pub.default_exchange.publish(
                    aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "read-turn"), TIMEOUT)
                assert await asyncio.wait_for(got.get(), TIMEOUT) == BODY
                await asyncio.sleep(0.01)  # (the consumer's ack handled: the store idle again)
            assert seen == [(1, True), (2, True), (3, True)]  # delivered and written in the read's turn


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_a_lone_mqtt_publish_to_an_idle_store_is_delivered_in_the_turn_that_read_it(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, flush: str) -> None:
    seen = await one_mqtt_delivery(data_dir, flush, "read-turn/t",
                                   lambda look: probe_reads(monkeypatch, MQTTConnection, look))
    assert seen == [(1, True)]  # delivered and written in the read's turn


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_an_amqp_delivery_is_written_in_the_turn_that_commits_its_message(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, flush: str) -> None:
    async with amqp_gateway(data_dir, flush=flush) as (gw, url):
        amqp = gw.amqp
        assert amqp is not None
        async with publisher_and_consumer(url, "turn") as (pub, got):
            seen = probe_commits(monkeypatch, lambda: (
                amqp.stats.messages_sent, not any(c._out for c in amqp.connections)))
            await asyncio.wait_for(pub.default_exchange.publish(
                aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "turn"), TIMEOUT)
            assert await asyncio.wait_for(got.get(), TIMEOUT) == BODY
            assert seen == [(1, True)]  # delivered and written before the commit's next turn


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_an_mqtt_delivery_is_written_in_the_turn_that_commits_its_message(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch, flush: str) -> None:
    seen = await one_mqtt_delivery(data_dir, flush, "turn/t", lambda look: probe_commits(monkeypatch, look))
    assert seen == [(1, True)]  # delivered and written before the commit's next turn


async def test_the_fdatasync_of_a_commit_is_asked_for_in_its_turn_after_its_amqp_delivery_is_written(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, bool]] = []  # at each fdatasync request: (deliveries made, all written)
    real_request = SyncFlusher._request

    async with amqp_gateway(data_dir, flush="sync") as (gw, url):
        amqp = gw.amqp
        assert amqp is not None

        def look() -> tuple[int, bool]:
            return amqp.stats.messages_sent, not any(c._out for c in amqp.connections)

        def request(self: SyncFlusher) -> None:
            asked.append(look())
            real_request(self)

        async with publisher_and_consumer(url, "asked", no_ack=True) as (pub, got):
            monkeypatch.setattr(SyncFlusher, "_request", request)
            seen = probe_commits(monkeypatch, lambda: (len(asked), *look()))
            await asyncio.wait_for(pub.default_exchange.publish(
                aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "asked"), TIMEOUT)
            assert await asyncio.wait_for(got.get(), TIMEOUT) == BODY
            assert asked[0] == (1, True)  # asked for once the delivery was written
            assert seen == [(1, 1, True)]  # ... before the commit's next turn


async def test_a_commit_that_delivers_leaves_no_empty_amqp_write_for_a_later_turn(data_dir: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit's turn writes its deliveries itself: the pump schedules no write of its
    connections for the next turn that would then find nothing to write."""
    writes: list[int] = []  # at each write of the connections woken together: how many
    real_flush = AMQPBroker._flush

    def flush(self: AMQPBroker) -> None:
        writes.append(len(self._to_flush))
        real_flush(self)

    async with amqp_gateway(data_dir, flush="sync") as (gw, url):
        async with publisher_and_consumer(url, "one-write") as (pub, got):
            monkeypatch.setattr(AMQPBroker, "_flush", flush)
            for _ in range(3):
                await asyncio.wait_for(pub.default_exchange.publish(
                    aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "one-write"), TIMEOUT)
                assert await asyncio.wait_for(got.get(), TIMEOUT) == BODY
            await asyncio.sleep(0.05)  # (a write scheduled for a later turn has run)
            assert writes == [1, 1, 1]  # one write a commit, of the consumer's connection


async def test_an_amqp_ack_pumps_its_queue_only_when_a_message_waits(data_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer held back by its prefetch gets the next message when it acks; an ack with
    nothing waiting schedules no pump (the next commit delivers): every pump delivers."""
    pumped: list[int] = []  # deliveries each pump made
    real_pump = QueueRuntime.pump

    async with amqp_gateway(data_dir, flush="sync") as (gw, url):
        amqp = gw.amqp
        assert amqp is not None

        def pump(self: QueueRuntime) -> None:
            before = amqp.stats.messages_sent
            real_pump(self)
            pumped.append(amqp.stats.messages_sent - before)

        publisher = await aio_pika.connect(url)
        consumer = await aio_pika.connect(url)
        try:
            pub = await publisher.channel(publisher_confirms=True)
            await pub.declare_queue("acked", durable=True)
            for _ in range(3):  # waiting before the consumer comes
                await pub.default_exchange.publish(
                    aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "acked")
            sub = await consumer.channel()
            await sub.set_qos(prefetch_count=1)
            queue = await sub.declare_queue("acked", durable=True)
            got: asyncio.Queue[bytes] = asyncio.Queue()

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                await message.ack()
                await got.put(message.body)

            monkeypatch.setattr(QueueRuntime, "pump", pump)
            await queue.consume(on_message)
            for _ in range(3):
                assert await asyncio.wait_for(got.get(), TIMEOUT) == BODY
            for _ in range(2):  # then one at a time, each acked before the next comes
                await asyncio.wait_for(pub.default_exchange.publish(
                    aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "acked"), TIMEOUT)
                assert await asyncio.wait_for(got.get(), TIMEOUT) == BODY
                await asyncio.sleep(0.05)  # (its ack read and handled)
            assert sum(pumped) == 5
            assert 0 not in pumped, pumped
        finally:
            await publisher.close()
            await consumer.close()
