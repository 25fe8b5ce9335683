"""Sync flush mode through real clients: a consumer gets a message as soon as it is written,
while the publisher's acknowledgement (AMQP confirm, MQTT PUBACK, remoting SEND_OK) waits for the fdatasync, as
RabbitMQ delivers a persistent message before the fsync that precedes its confirm. The store
does this for every protocol (tests/test_store_sync_delivery.py holds the store's side)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import paho.mqtt.client as paho
import pytest

from store.write.durable import SyncFlusher

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .remoting_support import remoting_gateway
from .test_amqp import amqp_gateway
from .test_store_sync_delivery import held_flusher  # noqa: F401 - a fixture

TIMEOUT = 5.0


async def test_an_amqp_consumer_gets_a_message_before_its_confirm_which_waits_for_the_fdatasync(
        data_dir: Path, held_flusher) -> None:  # noqa: F811
    release, _ = held_flusher
    async with amqp_gateway(data_dir, flush="sync") as (gw, url):
        publisher = await aio_pika.connect(url)
        consumer = await aio_pika.connect(url)
        try:
            pub = await publisher.channel(publisher_confirms=True)
            await pub.declare_queue("early", durable=True)
            sub = await consumer.channel()
            queue = await sub.declare_queue("early", durable=True)
            got: asyncio.Queue[bytes] = asyncio.Queue()

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                await got.put(message.body)
                await message.ack()

            await queue.consume(on_message)
            confirm = asyncio.ensure_future(pub.default_exchange.publish(
                aio_pika.Message(b"m1", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "early"))
            assert await asyncio.wait_for(got.get(), TIMEOUT) == b"m1"
            assert not confirm.done()  # held with the fdatasync
            release.set()
            await asyncio.wait_for(confirm, TIMEOUT)
            assert gw.store.commitlog.flushed_position == gw.store.commitlog.end_position
        finally:
            release.set()
            await publisher.close()
            await consumer.close()


async def test_an_mqtt_subscriber_gets_a_qos1_message_before_its_puback_which_waits_for_the_fdatasync(
        data_dir: Path, held_flusher) -> None:  # noqa: F811
    release, _ = held_flusher
    async with running_gateway(data_dir, flush="sync") as gw:
        port = mqtt_port(gw)
        subscriber = PahoClient(port, "sub")
        publisher = PahoClient(port, "pub")
        await subscriber.connect()
        await publisher.connect()
        try:
            await subscriber.subscribe("early/t", qos=1)
            info = publisher.client.publish("early/t", b"m1", qos=1)
            (received,) = await subscriber.receive(1)
            assert received.payload == b"m1"
            assert not info.is_published()  # no PUBACK yet: held with the fdatasync
            release.set()
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
            assert info.is_published() and info.rc == paho.MQTT_ERR_SUCCESS
        finally:
            release.set()
            await subscriber.disconnect()
            await publisher.disconnect()


async def test_an_mqtt_delivery_is_written_before_the_fdatasync_of_its_message_is_asked_for(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As for AMQP: the deliveries a commit wakes go out before its fdatasync is asked for."""
    seen: list[tuple[int, bool]] = []  # at each fdatasync request: (deliveries made, all written)
    real_request = SyncFlusher._request

    async with running_gateway(data_dir, flush="sync") as gw:
        mqtt = gw.mqtt
        assert mqtt is not None

        def request(self: SyncFlusher) -> None:
            seen.append((mqtt.stats.messages_sent, not any(c.out for c in mqtt.connections.values())))
            real_request(self)

        port = mqtt_port(gw)
        subscriber = PahoClient(port, "sub")
        publisher = PahoClient(port, "pub")
        await subscriber.connect()
        await publisher.connect()
        try:
            await subscriber.subscribe("soon/t", qos=1)
            monkeypatch.setattr(SyncFlusher, "_request", request)
            info = publisher.client.publish("soon/t", b"m1", qos=1)
            (received,) = await subscriber.receive(1)
            assert received.payload == b"m1"
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT)  # (its PUBACK: after the fdatasync)
            assert seen and seen[0] == (1, True)  # delivered and written when its fdatasync was asked for
        finally:
            await subscriber.disconnect()
            await publisher.disconnect()


@pytest.mark.usefixtures("rocketmq_home")
async def test_a_remoting_push_consumer_gets_a_message_before_its_send_ok_which_waits_for_the_fdatasync(
        data_dir: Path, held_flusher) -> None:  # noqa: F811
    from rocketmq import client as rmq

    from .test_remoting_cpp import Received, message, producer, push_consumer

    release, _ = held_flusher
    async with remoting_gateway(data_dir, flush="sync") as (_, addr):
        received = Received()
        c = await push_consumer(addr, "CID-early", "CppEarly", received.record("c1"))
        p = await producer(addr)
        try:
            release.set()  # a first message, acknowledged at once: the consumer is in place
            await asyncio.to_thread(p.send_sync, message("CppEarly", "m0"))
            await received.take(1)
            release.clear()
            send = asyncio.ensure_future(asyncio.to_thread(p.send_sync, message("CppEarly", "m1")))
            (got,) = await received.take(1)
            assert got["body"] == "m1"
            assert not send.done()  # no SEND_OK yet: held with the fdatasync
            release.set()
            assert (await asyncio.wait_for(send, TIMEOUT)).status == rmq.SendStatus.OK
        finally:
            release.set()
            await asyncio.to_thread(c.shutdown)
            await asyncio.to_thread(p.shutdown)
