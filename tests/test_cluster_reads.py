"""A gateway node's reads through its one cache (the store link gives what it fetches to the
queue cache): a session catching up behind the window the other readers share, and many
readers of one queue -- with the cache on, and off (``queue_cache_bytes = 0``: what was fetched
for a read must still reach that read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocols.mqtt.packets import MQTT_5, Connect, Publish, SubAck, Subscribe, Subscription

from .mqtt_support import PahoClient, RawClient, mqtt_port
from .test_cluster_mqtt import cluster

CACHE = pytest.mark.parametrize("cache_bytes", [64 << 20, 0], ids=["cache-on", "cache-off"])


@CACHE
async def test_a_session_behind_the_window_gets_every_message_while_others_read_the_tail(
        data_dir: Path, cache_bytes: int) -> None:
    async with cluster(data_dir, queue_cache_bytes=cache_bytes) as (_, (a, b)):
        late = PahoClient(mqtt_port(b), "late", clean=False)
        await late.connect()
        await late.subscribe("line/1", 1)
        await late.disconnect()
        tail = PahoClient(mqtt_port(b), "tail")
        await tail.connect()
        await tail.subscribe("line/1", 1)
        sender = PahoClient(mqtt_port(a), "sender")
        await sender.connect()
        sent = [str(i).encode() for i in range(150)]  # more than one fetch and one pull batch
        for body in sent[:130]:
            await sender.publish("line/1", body, 1)
        assert [m.payload for m in await tail.receive(130)] == sent[:130]

        back = PahoClient(mqtt_port(b), "late", clean=False)
        flags, _, _ = await back.connect()
        assert flags.session_present
        for body in sent[130:]:  # the tail moves on while the session catches up
            await sender.publish("line/1", body, 1)
        assert [m.payload for m in await back.receive(150)] == sent
        assert [m.payload for m in await tail.receive(20)] == sent[130:]
        await back.nothing_more()
        for client in (back, tail, sender):
            await client.disconnect()


@CACHE
async def test_many_readers_of_one_queue_on_a_gateway_node_each_get_every_message(
        data_dir: Path, cache_bytes: int) -> None:
    async with cluster(data_dir, queue_cache_bytes=cache_bytes) as (_, (a, b)):
        readers = []
        for i in range(40):
            client, _ = await RawClient.connected(mqtt_port(b), Connect(client_id=f"r{i}", version=MQTT_5))
            client.send(Subscribe(1, [Subscription("fan/out", 0)]))
            readers.append(client)
        for client in readers:
            assert isinstance(await client.recv(), SubAck)
        sender = PahoClient(mqtt_port(a), "sender")
        await sender.connect()
        sent = [str(i).encode() for i in range(80)]
        for body in sent:
            await sender.publish("fan/out", body, 1)
        for client in readers:
            got = [await client.recv() for _ in sent]
            assert all(isinstance(p, Publish) for p in got)
            assert [p.payload for p in got] == sent
        if cache_bytes:
            assert b.mqtt.cache.stats.hits >= 39 * len(sent)
        else:
            assert b.mqtt.cache.stats.bytes == 0  # nothing kept once every answer was taken
        for client in readers:
            await client.close()
        await sender.disconnect()
