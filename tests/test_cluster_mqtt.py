"""Gateway nodes (``role = "gateway"``) over one store node (``role = "store"``), in one process:
paho clients on different nodes exchange messages at every QoS, through wildcard queues the
store node expands; a persistent session moves from one node to another and resumes at its
offsets; retained messages set on one node are sent on another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aio_pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.config import Config
from gateway.server import Gateway
from protocols.mqtt.packets import MQTT_5, Connect, SubAck, Subscribe, Subscription

from .mqtt_support import PahoClient, RawClient, mqtt_port
from .test_metrics import fetch, samples, value
from .test_store_link import remoting_port


@asynccontextmanager
async def cluster(data_dir: Path, gateways: int = 2, **node_options) -> AsyncIterator[tuple[Gateway, list[Gateway]]]:
    store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="",
                           remoting_bind="127.0.0.1:0", metrics_bind="127.0.0.1:0"))
    await store.start()
    nodes: list[Gateway] = []
    try:
        for i in range(gateways):
            node = Gateway(Config(data_dir=data_dir / f"unused-{i}", role="gateway", node_id=f"g{i}",
                                  store_address=f"127.0.0.1:{remoting_port(store)}", mqtt_bind="127.0.0.1:0",
                                  amqp_bind="", remoting_bind="", metrics_bind="127.0.0.1:0", **node_options))
            await node.start()
            nodes.append(node)
        yield store, nodes
    finally:
        for node in nodes:
            await node.stop()
        await store.stop()


@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_publish_on_one_node_reaches_subscribers_on_another(data_dir: Path, qos: int) -> None:
    async with cluster(data_dir) as (store, (a, b)):
        subscriber = PahoClient(mqtt_port(b), "sub")
        await subscriber.connect()
        await subscriber.subscribe([("plant/+/temp", qos), ("plant/p1/hum", qos)])
        publisher = PahoClient(mqtt_port(a), "pub")
        await publisher.connect()
        for i in range(5):
            await publisher.publish("plant/p1/temp", f"t{i}", qos)
            await publisher.publish("plant/p1/hum", f"h{i}", qos)
        received = await subscriber.receive(10)
        assert [r.payload for r in received if r.topic == "plant/p1/temp"] == [f"t{i}".encode() for i in range(5)]
        assert [r.payload for r in received if r.topic == "plant/p1/hum"] == [f"h{i}".encode() for i in range(5)]
        assert {r.qos for r in received} == {qos}
        await subscriber.nothing_more()
        # written once, in the store node's store, into the topic queue and the wildcard queue
        assert store.store.max_offset_now("t:plant/p1/temp") == 5
        assert store.store.max_offset_now("w:plant/+/temp") == 5
        assert a.store is None and b.store is None  # gateway nodes keep no store of their own
        await publisher.disconnect()
        await subscriber.disconnect()


async def test_persistent_session_resumes_on_another_node(data_dir: Path) -> None:
    async with cluster(data_dir) as (_, (a, b)):
        device = PahoClient(mqtt_port(a), "dev-9", clean=False)
        await device.connect()
        await device.subscribe("cmd/dev-9/#", qos=1)
        await device.disconnect()
        sender = PahoClient(mqtt_port(a), "ops")
        await sender.connect()
        for i in range(3):
            await sender.publish(f"cmd/dev-9/set{i}", f"v{i}", 1)  # while the device is away
        back = PahoClient(mqtt_port(b), "dev-9", clean=False)
        flags, _, _ = await back.connect()
        assert flags.session_present
        assert [r.payload for r in await back.receive(3)] == [b"v0", b"v1", b"v2"]
        await sender.publish("cmd/dev-9/set3", "v3", 1)  # and once it is back, on the other node
        assert [r.payload for r in await back.receive(1)] == [b"v3"]
        await back.nothing_more()
        await back.disconnect()
        await sender.disconnect()


async def test_retained_message_set_on_one_node_is_sent_on_another(data_dir: Path) -> None:
    async with cluster(data_dir) as (_, (a, b)):
        publisher = PahoClient(mqtt_port(a), "pub")
        await publisher.connect()
        await publisher.publish("status/line-4", "running", 1, retain=True)
        subscriber = PahoClient(mqtt_port(b), "late")
        await subscriber.connect()
        await subscriber.subscribe("status/#", qos=1)
        [retained] = await subscriber.receive(1)
        assert (retained.topic, retained.payload, retained.retain) == ("status/line-4", b"running", True)
        await publisher.disconnect()
        await subscriber.disconnect()


async def test_store_node_ends_expired_sessions_of_absent_clients(data_dir: Path) -> None:
    async with cluster(data_dir) as (store, (a, b)):
        device = PahoClient(mqtt_port(a), "brief", version=MQTT_5, clean=False, session_expiry=1)
        await device.connect()
        await device.subscribe("fleet/+/pos", qos=1)
        await device.disconnect()
        publisher = PahoClient(mqtt_port(b), "pub")
        await publisher.connect()
        await publisher.publish("fleet/t1/pos", "1", 1)
        assert store.store.max_offset_now("w:fleet/+/pos") == 1  # the absent session's queue fills
        service = store.store_service
        store.store.table("mqtt.sessions").put("garbled", b"{not json")  # no node can resume it: it ends
        assert service.expire_sessions(time.time()) == ["garbled"]  # "brief": not yet
        assert service.expire_sessions(time.time() + 2) == ["brief"]
        await publisher.publish("fleet/t1/pos", "2", 1)
        assert store.store.max_offset_now("w:fleet/+/pos") == 1  # its filter is held no more
        back = PahoClient(mqtt_port(a), "brief", version=MQTT_5, clean=False, session_expiry=60)
        flags, _, _ = await back.connect()
        assert not flags.session_present
        await back.disconnect()
        await publisher.disconnect()


async def test_notify_goes_only_to_nodes_that_read_the_queue(data_dir: Path) -> None:
    async with cluster(data_dir, gateways=3) as (store, (a, b, c)):
        reader = PahoClient(mqtt_port(b), "reader")
        await reader.connect()
        await reader.subscribe("only/b", 1)
        publisher = PahoClient(mqtt_port(a), "pub")
        await publisher.connect()
        for i in range(20):
            await publisher.publish("only/b", str(i), 1)
        assert len(await reader.receive(20)) == 20
        assert b.gateway_store.notify_events >= 1
        assert a.gateway_store.notify_events == 0 and c.gateway_store.notify_events == 0
        stats = store.store_service.router.stats
        assert stats.broadcast == 0 and stats.targeted >= 1
        await reader.disconnect()  # its node reads the queue no more: no more events there
        seen = b.gateway_store.notify_events
        later = PahoClient(mqtt_port(c), "later")
        await later.connect()
        await later.subscribe("only/b", 1)
        await publisher.publish("only/b", "after", 1)
        assert [r.payload for r in await later.receive(1)] == [b"after"]  # routed to c by now
        assert b.gateway_store.notify_events == seen
        await later.disconnect()
        await publisher.disconnect()
        at_store = samples((await fetch("http://{}:{}".format(*store.metrics_address), "/metrics"))[1])
        assert value(at_store, "tidemq_cluster_gateway_nodes") == 3
        assert value(at_store, "tidemq_notify_events_routed_total", how="targeted") == stats.targeted
        assert value(at_store, "tidemq_notify_messages_sent_total") == stats.messages > 0
        at_b = samples((await fetch("http://{}:{}".format(*b.metrics_address), "/metrics"))[1])
        assert value(at_b, "tidemq_notify_events_received_total") == seen > 0
        assert value(at_b, "tidemq_store_link_reads_total") >= 1
        assert value(at_b, "tidemq_messages_sent_total", protocol="mqtt") == 20


async def test_a_client_id_connecting_to_another_node_takes_the_session_over(data_dir: Path) -> None:
    async with cluster(data_dir) as (_, (a, b)):
        first = PahoClient(mqtt_port(a), "twin", version=MQTT_5, clean=False, session_expiry=300)
        await first.connect()
        await first.subscribe("twin/in", qos=1)
        sender = PahoClient(mqtt_port(b), "sender")
        await sender.connect()
        await sender.publish("twin/in", "before", 1)
        assert [r.payload for r in await first.receive(1)] == [b"before"]
        first.client.reconnect_delay_set(min_delay=60, max_delay=120)  # paho must not take it back meanwhile
        second = PahoClient(mqtt_port(b), "twin", version=MQTT_5, clean=False, session_expiry=300)
        flags, _, _ = await second.connect()
        assert flags.session_present  # the session as node a left it
        reason = await asyncio.to_thread(first.disconnects.get, True, 5)
        assert reason == 0x8E  # DISCONNECT: session taken over
        await asyncio.to_thread(first.client.loop_stop)  # (paho would reconnect and take it back)
        assert "twin" not in a.mqtt.connections and "twin" in b.mqtt.connections
        await sender.publish("twin/in", "after", 1)
        assert [r.payload for r in await second.receive(1)] == [b"after"]
        await second.nothing_more()
        await second.disconnect()
        await sender.disconnect()


async def test_many_subscribers_of_one_topic_cost_one_store_read_per_batch(data_dir: Path) -> None:
    async with cluster(data_dir) as (_, (a, b)):
        subscribers = []
        for i in range(200):
            client, _ = await RawClient.connected(mqtt_port(b), Connect(client_id=f"s{i}", version=MQTT_5))
            client.send(Subscribe(1, [Subscription("hot/topic", 0)]))
            subscribers.append(client)
        for client in subscribers:
            assert isinstance(await client.recv(), SubAck)
        reads_before = b.gateway_store.fetches
        publisher = PahoClient(mqtt_port(a), "pub")
        await publisher.connect()
        for i in range(50):
            await publisher.publish("hot/topic", str(i), 1)
        for client in subscribers:
            got = [await client.recv() for _ in range(50)]
            assert [p.payload for p in got] == [str(i).encode() for i in range(50)]
        reads = b.gateway_store.fetches - reads_before
        assert 1 <= reads <= 50, f"{reads} store reads for 50 messages to 200 subscribers"
        cache = b.mqtt.cache.stats
        assert cache.hits >= 199 * 50
        for client in subscribers:
            await client.close()
        await publisher.disconnect()


async def test_a_gateway_node_does_not_read_back_what_its_own_clients_publish(data_dir: Path) -> None:
    """Messages published on a node to queues its subscribers read at their end go to its
    queue cache as stored (the put's receipt), not read back from the store node: its
    subscribers (an exact and a wildcard filter) get every message, in order, with its
    properties, as a subscriber on another node (which reads them from the store) does."""
    async with cluster(data_dir) as (_, (a, b)):
        here = PahoClient(mqtt_port(b), "here", version=MQTT_5)
        await here.connect()
        await here.subscribe("own/+/t", qos=1)
        there = PahoClient(mqtt_port(a), "there", version=MQTT_5)
        await there.connect()
        await there.subscribe("own/+/t", qos=1)
        exact = PahoClient(mqtt_port(b), "exact", version=MQTT_5)
        await exact.connect()
        await exact.subscribe("own/x/t", qos=1)
        publisher = PahoClient(mqtt_port(b), "pub", version=MQTT_5)
        await publisher.connect()
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("k", "v")]
        props.ContentType = "text/plain"
        await publisher.publish("own/x/t", "warm-up", 1)  # (the caches follow the queues' ends from here)
        for client in (here, there, exact):
            assert [r.payload for r in await client.receive(1)] == [b"warm-up"]
        reads_before = b.gateway_store.fetches
        for i in range(100):
            await publisher.publish("own/x/t", str(i), 1, properties=props)
        expected = [str(i).encode() for i in range(100)]
        mine, theirs, exacts = (await here.receive(100), await there.receive(100), await exact.receive(100))
        assert [r.payload for r in mine] == [r.payload for r in theirs] == [r.payload for r in exacts] == expected
        assert {(r.properties.UserProperty[0], r.properties.ContentType) for r in mine + theirs + exacts} == {
            (("k", "v"), "text/plain")}
        reads = b.gateway_store.fetches - reads_before
        assert reads <= 5, f"{reads} store reads on the publishers' node for 100 of its own messages"
        for client in (here, there, exact, publisher):
            await client.disconnect()


async def test_two_nodes_publishing_to_one_topic_each_deliver_every_message_in_the_stores_order(data_dir: Path) -> None:
    """Both nodes write the same queue: each node's own messages reach its cache from their
    receipts, the other's from the store, and a subscriber on each node gets every message
    once, both in the same order (the queue's), each publisher's in the order it sent them."""
    async with cluster(data_dir) as (_, (a, b)):
        subscribers = []
        for node, name in ((a, "sa"), (b, "sb")):
            client = PahoClient(mqtt_port(node), name, version=MQTT_5)
            await client.connect()
            await client.subscribe("mixed/+", qos=1)
            subscribers.append(client)
        publishers = []
        for node, name in ((a, "pa"), (b, "pb")):
            client = PahoClient(mqtt_port(node), name)
            await client.connect()
            publishers.append(client)

        async def send(publisher: PahoClient, tag: str) -> None:
            for i in range(150):
                await publisher.publish(f"mixed/{tag}", f"{tag}{i}", 1)
        await asyncio.gather(send(publishers[0], "a"), send(publishers[1], "b"))
        got = [[r.payload.decode() for r in await client.receive(300)] for client in subscribers]
        assert got[0] == got[1]
        for tag in "ab":
            assert [p for p in got[0] if p.startswith(tag)] == [f"{tag}{i}" for i in range(150)]
        for client in subscribers:
            await client.nothing_more()
        for client in subscribers + publishers:
            await client.disconnect()


async def test_gateway_node_keeps_its_clients_through_a_store_node_restart(data_dir: Path) -> None:
    """The store node restarts within the node's failover_s: its clients stay connected (a new
    one is refused meanwhile), a publish sent while it is down is acknowledged once it is back,
    and the session reads on. Down longer than failover_s: the clients are dropped."""
    store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0"))
    await store.start()
    port = remoting_port(store)
    node = Gateway(Config(data_dir=data_dir / "unused", role="gateway", node_id="g", mqtt_bind="127.0.0.1:0",
                          amqp_bind="", remoting_bind="", store_address=f"127.0.0.1:{port}"))
    await node.start()
    try:
        device = PahoClient(mqtt_port(node), "keeper", clean=False)
        await device.connect()
        await device.subscribe("k/#", 1)
        await device.publish("k/1", "before", 1)
        assert [r.payload for r in await device.receive(1)] == [b"before"]
        await store.stop()  # the store node goes away ...
        for _ in range(100):
            if node.not_ready() is not None:
                break
            await asyncio.sleep(0.05)
        assert node.not_ready() == "the link to the store node is down"
        refused = PahoClient(mqtt_port(node), "early")
        flags_rc = await refused.connect()
        assert flags_rc[1] != 0  # CONNACK refused: server unavailable
        await asyncio.to_thread(refused.client.loop_stop)
        waiting = device.client.publish("k/2", "during", 1)  # held until the store node is back
        store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="",
                               remoting_bind=f"127.0.0.1:{port}"))
        await store.start()  # ... and comes back on the same address
        await asyncio.to_thread(waiting.wait_for_publish, 10)
        assert waiting.is_published()
        await device.publish("k/3", "after", 1)
        got = [r.payload for r in await device.receive(2)]
        assert got == [b"during", b"after"]
        assert device.disconnects.empty()
        assert node.not_ready() is None

        assert node.gateway_store is not None
        node.gateway_store.failover_s = 0.5
        await store.stop()  # down for longer than failover_s: the node drops its clients
        assert await asyncio.to_thread(device.disconnects.get, True, 10) is not None
        await asyncio.to_thread(device.client.loop_stop)
    finally:
        await node.stop()
        await store.stop()


async def test_amqp_on_a_gateway_node_is_relayed_to_the_store_node(data_dir: Path) -> None:
    store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="127.0.0.1:0",
                           remoting_bind="127.0.0.1:0"))
    await store.start()
    node = Gateway(Config(data_dir=data_dir / "unused", role="gateway", node_id="g", mqtt_bind="127.0.0.1:0",
                          amqp_bind="127.0.0.1:0", remoting_bind="", store_address=f"127.0.0.1:{remoting_port(store)}"))
    await node.start()
    try:
        amqp_port = next(listener.address[1] for listener in node.listeners if listener.protocol == "amqp")
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/")
        channel = await conn.channel()
        queue = await channel.declare_queue("alarms")
        await queue.bind("amq.topic", "plant.*.alarm")
        device = PahoClient(mqtt_port(node), "press")
        await device.connect()
        await device.subscribe("cmd/press", 1)
        await device.publish("plant/p1/alarm", "too hot", 1)  # MQTT on the gateway node ...
        async with queue.iterator() as messages:
            async for message in messages:  # ... to an AMQP app through the gateway node's relay
                assert (message.body, message.routing_key) == (b"too hot", "plant.p1.alarm")
                await message.ack()
                break
        exchange = await channel.get_exchange("amq.topic")
        await exchange.publish(aio_pika.Message(b"cool down"), routing_key="cmd.press")  # and back
        assert [r.payload for r in await device.receive(1)] == [b"cool down"]
        assert "alarms" in store.amqp.queues  # the queue lives on the store node
        await conn.close()
        await device.disconnect()
    finally:
        await node.stop()
        await store.stop()


async def test_a_session_back_on_the_node_it_left_gets_what_was_published_meanwhile(data_dir: Path) -> None:
    """The node stopped reading the session's queue when it left (no notify events since): what
    it knew of the queue's end is stale, and must not be taken for the end (the messages
    published meanwhile waited for the next publish to the queue)."""
    async with cluster(data_dir) as (_, (a, b)):
        device = PahoClient(mqtt_port(a), "dev-3", clean=False)
        await device.connect()
        await device.subscribe("valve/3", 1)
        sender = PahoClient(mqtt_port(b), "ops")
        await sender.connect()
        await sender.publish("valve/3", "open", 1)
        assert [m.payload for m in await device.receive(1)] == [b"open"]
        await device.disconnect()
        await asyncio.sleep(0.3)  # (node a has written the session back)
        await sender.publish("valve/3", "close", 1)
        back = PahoClient(mqtt_port(a), "dev-3", clean=False)
        flags, _, _ = await back.connect()
        assert flags.session_present
        assert [m.payload for m in await back.receive(1)] == [b"close"]
        await back.nothing_more()
        await back.disconnect()
        await sender.disconnect()


async def test_the_data_read_api_of_a_gateway_node_points_to_the_store_node(data_dir: Path) -> None:
    """A gateway node holds no store: its data read API says so (501, where to read instead),
    not that its store is "not open" (503, as if it would be open later)."""
    async with cluster(data_dir, gateways=1) as (store, (a,)):
        status, text = await fetch("http://{}:{}".format(*a.metrics_address), "/data/offsets?queue=t:x")
        assert status == 501 and "store node" in text, (status, text)
        status, _ = await fetch("http://{}:{}".format(*store.metrics_address), "/data/offsets?queue=t:x")
        assert status == 200


@pytest.mark.parametrize("same_node", [True, False])
async def test_a_session_back_reading_a_queue_never_written_gets_the_next_publish(data_dir: Path,
                                                                                 same_node: bool) -> None:
    """The session's topic queue does not exist yet when it comes back: the empty answer the
    node read then must not stand for the queue once messages arrive (0 of 1 was received)."""
    async with cluster(data_dir) as (_, (a, b)):
        device = PahoClient(mqtt_port(a), "dev-7", clean=False)
        await device.connect()
        await device.subscribe("cmd/x", 1)
        await device.disconnect()
        await asyncio.sleep(0.3)  # (node a has written the session back)
        back = PahoClient(mqtt_port(a if same_node else b), "dev-7", clean=False)
        flags, _, _ = await back.connect()
        assert flags.session_present
        sender = PahoClient(mqtt_port(b), "ops")
        await sender.connect()
        await sender.publish("cmd/x", "go", 1)
        assert [m.payload for m in await back.receive(1)] == [b"go"]
        await back.nothing_more()
        await back.disconnect()
        await sender.disconnect()
