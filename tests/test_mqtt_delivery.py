"""MQTT publish/subscribe through real clients (paho-mqtt 3.1.1 and 5.0, raw sockets):
QoS 0/1/2, order, overlapping subscriptions, wildcard queues, inflight window, QoS 2 state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.interop import queue_for_filter
from protocols.mqtt.codec import encode
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from protocols.mqtt.properties import Properties

from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_publish_subscribe_in_order(data_dir: Path, version: int, qos: int) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub", version=version)
        pub = PahoClient(port, "pub", version=version)
        await sub.connect()
        await pub.connect()
        assert list(await sub.subscribe("dev/+/temp", qos)) in ([qos], [paho_code(qos)])
        for i in range(50):
            await pub.publish(f"dev/d{i % 2}/temp", f"m{i}", qos)
        got = await sub.receive(50)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(50)]
        assert {m.qos for m in got} == {qos}
        assert [m.topic for m in got[:2]] == ["dev/d0/temp", "dev/d1/temp"]
        await sub.nothing_more(0.3)
        await sub.disconnect()
        await pub.disconnect()


def paho_code(qos: int):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode
    return ReasonCode(PacketTypes.SUBACK, identifier=qos)


async def test_granted_qos_caps_delivery_and_overlaps_deliver_once(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub")
        pub = PahoClient(port, "pub")
        await sub.connect()
        await pub.connect()
        await sub.subscribe([("a/b", 0), ("a/+", 1), ("a/#", 0)])
        await pub.publish("a/b", "x", 2)  # matches all three: once, at the highest granted QoS (1)
        await pub.publish("a/c", "y", 2)  # a/+ and a/#: once at QoS 1
        await pub.publish("a/c/d", "z", 2)  # a/# only: QoS 0
        got = await sub.receive(3)
        assert [(m.topic, m.payload, m.qos) for m in got] == [("a/b", b"x", 1), ("a/c", b"y", 1), ("a/c/d", b"z", 0)]
        await sub.nothing_more()
        await sub.disconnect()
        await pub.disconnect()


async def test_messages_to_topics_without_subscribers_are_stored(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        pub = PahoClient(mqtt_port(gw), "pub")
        await pub.connect()
        for i in range(3):
            await pub.publish("nobody/listens", f"v{i}", 1)
        result = gw.store.get_now("t:nobody/listens", 0, 10)
        assert [m.body for m in result.messages] == [b"v0", b"v1", b"v2"]
        assert result.messages[0].flag == 0x100 | 1  # published over MQTT at QoS 1
        assert result.messages[0].properties == {"mqtt.cid": "pub"}
        await pub.disconnect()


async def test_wildcard_queue_is_written_only_while_subscribed(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        pub = PahoClient(port, "pub")
        await pub.connect()
        await pub.publish("s/1", "before", 1)
        sub = PahoClient(port, "sub")
        await sub.connect()
        await sub.subscribe("s/+", 1)
        await pub.publish("s/1", "during", 1)
        assert [m.payload for m in await sub.receive(1)] == [b"during"]
        assert [m.body for m in gw.store.get_now("w:s/+", 0, 10).messages] == [b"during"]
        await sub.disconnect()  # clean session: the wildcard queue loses its last subscriber
        await pub.publish("s/1", "after", 1)
        assert [m.body for m in gw.store.get_now("w:s/+", 0, 10).messages] == [b"during"]
        assert [m.body for m in gw.store.get_now("t:s/1", 0, 10).messages] == [b"before", b"during", b"after"]
        await pub.disconnect()


async def test_receive_maximum_bounds_the_inflight_window(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub, ack = await RawClient.connected(port, Connect("sub", MQTT_5, properties=Properties(receive_maximum=2)))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        sub.send(Subscribe(1, [Subscription("w/#", 1)]))
        assert isinstance(await sub.recv(), SubAck)
        pub = PahoClient(port, "pub")
        await pub.connect()
        for i in range(5):
            await pub.publish("w/x", f"{i}", 1)
        first = [await sub.recv(), await sub.recv()]
        assert [p.payload for p in first] == [b"0", b"1"]
        with pytest.raises(TimeoutError):
            await sub.recv(timeout=0.4)  # the window is full
        sub.send(PubAck(first[0].packet_id))
        third = await sub.recv()
        assert third.payload == b"2"
        with pytest.raises(TimeoutError):
            await sub.recv(timeout=0.3)
        await sub.close()
        await pub.disconnect()


async def test_qos2_outbound_exactly_once_across_reconnect(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        connect = Connect("q2", MQTT_5, clean_start=False, properties=Properties(session_expiry_interval=300))
        sub, _ = await RawClient.connected(port, connect)
        sub.send(Subscribe(1, [Subscription("q/2", 2)]))
        await sub.recv()
        pub = PahoClient(port, "pub")
        await pub.connect()
        await pub.publish("q/2", "once", 2)
        first = await sub.recv()
        assert isinstance(first, Publish) and first.qos == 2 and not first.dup
        await sub.close()  # no PUBREC: the message is still inflight
        sub, ack = await RawClient.connected(port, connect)
        assert ack.session_present
        again = await sub.recv()
        assert (again.packet_id, again.dup, again.payload) == (first.packet_id, True, b"once")
        sub.send(PubRec(again.packet_id))
        rel = await sub.recv()
        assert isinstance(rel, PubRel) and rel.packet_id == first.packet_id
        await sub.close()  # PUBREC sent, no PUBCOMP: next time only the PUBREL comes back
        sub, _ = await RawClient.connected(port, connect)
        rel = await sub.recv()
        assert isinstance(rel, PubRel) and rel.packet_id == first.packet_id
        sub.send(PubComp(rel.packet_id))
        with pytest.raises(TimeoutError):
            await sub.recv(timeout=0.5)
        await sub.close()
        await pub.disconnect()


async def test_qos2_inbound_resend_is_stored_once(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        connect = Connect("p2", MQTT_5, clean_start=False, properties=Properties(session_expiry_interval=300))
        pub, _ = await RawClient.connected(port, connect)
        pub.send(Publish("in/2", b"one", 2, packet_id=7))
        rec = await pub.recv()
        assert isinstance(rec, PubRec) and rec.packet_id == 7
        await pub.close()  # no PUBREL: the client will resend the PUBLISH with DUP
        pub, _ = await RawClient.connected(port, connect)
        pub.send(Publish("in/2", b"one", 2, dup=True, packet_id=7))
        assert isinstance(await pub.recv(), PubRec)
        pub.send(PubRel(7))
        comp = await pub.recv()
        assert isinstance(comp, PubComp) and comp.reason_code == 0
        pub.send(PubRel(7))  # unknown now
        assert (await pub.recv()).reason_code == 0x92
        assert [m.body for m in gw.store.get_now("t:in/2", 0, 10).messages] == [b"one"]
        await pub.close()


async def test_receive_maximum_counts_qos2_until_pubcomp_and_qos1_until_puback(data_dir: Path) -> None:
    """MQTT 5.0 sections 3.3.4 and 4.9: a QoS 2 PUBLISH counts against the server's Receive
    Maximum until its PUBCOMP, a QoS 1 PUBLISH until its PUBACK; one more is DISCONNECT 0x93."""
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        pub, ack = await RawClient.connected(port, Connect("rm", MQTT_5))
        limit = ack.properties.receive_maximum
        assert limit == 1024
        for i in range(1, limit):  # all but one of the quota: unreleased QoS 2
            pub.send(Publish("rm/2", b"%d" % i, 2, packet_id=i))
        got = [await pub.recv() for _ in range(1, limit)]
        assert all(isinstance(p, PubRec) and p.reason_code == 0 for p in got)
        for pid in (2000, 2001, 2002):  # QoS 1 one at a time: each is free again at its PUBACK
            pub.send(Publish("rm/1", b"q1", 1, packet_id=pid))
            assert await pub.recv() == PubAck(pid)
        pub.send(PubRel(1))  # a PUBCOMP frees one
        assert await pub.recv() == PubComp(1)
        pub.send(Publish("rm/2", b"last", 2, packet_id=limit))
        pub.send(Publish("rm/2", b"last", 2, packet_id=limit + 1))  # 1,024 unreleased: full
        assert [await pub.recv(), await pub.recv()] == [PubRec(limit), PubRec(limit + 1)]
        pub.send(Publish("rm/2", b"over", 2, packet_id=limit + 2))
        rest = await pub.closed()
        assert [(type(p).__name__, p.reason_code) for p in rest] == [("Disconnect", 0x93)]
        assert len(gw.store.get_now("t:rm/2", 0, 2 * limit).messages) == limit + 1
        await pub.close()


async def test_receive_maximum_counts_an_unacknowledged_qos1(data_dir: Path) -> None:
    async with running_gateway(data_dir, mqtt_receive_maximum=4) as gw:
        pub, _ = await RawClient.connected(mqtt_port(gw), Connect("rm1", MQTT_5))
        for pid in range(1, 4):
            pub.send(Publish("rm/2", b"x", 2, packet_id=pid))
        assert [type(await pub.recv()) for _ in range(3)] == [PubRec] * 3
        # the fourth (allowed) and the fifth in one write: read before the store acknowledges either
        pub.send_raw(encode(Publish("rm/1", b"y", 1, packet_id=10), MQTT_5)
                     + encode(Publish("rm/1", b"z", 1, packet_id=11), MQTT_5))
        rest = await pub.closed()
        assert [type(p).__name__ for p in rest][-1] == "Disconnect" and rest[-1].reason_code == 0x93
        await pub.close()


async def test_shared_subscription_spreads_and_redelivers(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        members = []
        for name in ("m1", "m2"):
            client, _ = await RawClient.connected(port, Connect(name, MQTT_5))
            client.send(Subscribe(1, [Subscription("$share/workers/jobs/+", 1)]))
            assert (await client.recv()).reason_codes == [1]
            members.append(client)
        plain = PahoClient(port, "plain", version=MQTT_5)
        await plain.connect()
        await plain.subscribe("jobs/+", 1)  # a non-shared subscriber still gets everything
        pub = PahoClient(port, "pub")
        await pub.connect()
        for i in range(10):
            await pub.publish(f"jobs/{i % 3}", f"j{i}", 1)
        first = [await members[0].recv() for _ in range(5)]
        second = [await members[1].recv() for _ in range(5)]
        assert sorted(p.payload for p in first + second) == sorted(f"j{i}".encode() for i in range(10))
        assert len(await plain.receive(10)) == 10
        for p in second:
            members[1].send(PubAck(p.packet_id))
        await members[0].close()  # leaves without acknowledging its five
        again = [await members[1].recv() for _ in range(5)]
        assert sorted(p.payload for p in again) == sorted(p.payload for p in first)
        for p in again:
            members[1].send(PubAck(p.packet_id))
        with pytest.raises(TimeoutError):
            await members[1].recv(timeout=0.4)
        await members[1].close()
        await plain.disconnect()
        await pub.disconnect()


async def test_fan_out_reads_decodes_and_encodes_once_not_per_subscriber(data_dir: Path) -> None:
    """200 subscribers of one topic: a store read per batch, and per message one decoding
    (a Delivery of the broker's memo) and one encoded PUBLISH (they all get the same variant,
    one template per Delivery), not 200."""
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        subscribers = []
        for i in range(200):
            client, _ = await RawClient.connected(port, Connect(f"fan{i}", MQTT_3_1_1))
            client.send(Subscribe(1, [Subscription("hot/topic", 0)]))
            await client.recv()
            subscribers.append(client)
        stats = gw.mqtt.cache.stats
        reads_before = stats.store_reads
        memo = gw.mqtt.deliveries
        decoded_before = memo.decoded
        pub = PahoClient(port, "pub")
        await pub.connect()
        for i in range(20):
            await pub.publish("hot/topic", f"{i}", 1)
        for client in subscribers:
            got = [await client.recv() for _ in range(20)]
            assert [p.payload for p in got] == [f"{i}".encode() for i in range(20)]
        # each notify batch costs one store read shared by all 200 subscribers
        assert stats.store_reads - reads_before <= 20
        assert stats.hits >= 199 * 20
        assert memo.decoded - decoded_before == 20
        assert [len(delivery.templates) for delivery in memo.live()] == [1] * 20  # the cache keeps the 20 alive
        for client in subscribers:
            await client.close()
        await pub.disconnect()


async def test_slow_qos0_subscriber_is_bounded_and_others_unaffected(data_dir: Path) -> None:
    async with running_gateway(data_dir, mqtt_max_queued_messages=100) as gw:
        port = mqtt_port(gw)
        slow, _ = await RawClient.connected(port, Connect("slow", MQTT_3_1_1))
        slow.send(Subscribe(1, [Subscription("flood", 0)]))
        await slow.recv()
        slow.writer.transport.pause_reading()  # never reads: its socket buffers fill up
        fast = PahoClient(port, "fast")
        await fast.connect()
        await fast.subscribe("flood", 1)
        pub, _ = await RawClient.connected(port, Connect("pub", MQTT_3_1_1))
        payload = b"x" * 4096
        for i in range(3000):
            pub.send(Publish("flood", payload, 0))
            if i % 200 == 0:
                await pub.writer.drain()
        await pub.writer.drain()
        assert len(await fast.receive(3000, timeout=30)) == 3000
        conn = gw.mqtt.connections["slow"]
        assert conn.transport.get_write_buffer_size() <= 2 << 20  # bounded, not 12 MB
        assert gw.mqtt.stats.publish_dropped > 0
        await fast.disconnect()
        await slow.close()
        await pub.close()


async def test_a_shared_group_whose_members_all_left_is_dropped_and_resumes_from_the_store(data_dir: Path) -> None:
    """A group is dropped when its last member leaves with nothing unacknowledged (groups used
    to pile up in memory, one per group ever joined); its committed offset is all it was, so a
    member back later gets what came meanwhile, and nothing acknowledged before. A group whose
    last member left holding messages keeps them for the next member."""
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        pub = PahoClient(port, "pub")
        await pub.connect()
        member = PahoClient(port, "m1")
        await member.connect()
        await member.subscribe("$share/g/jobs", 1)
        await pub.publish("jobs", "j0", 1)
        assert [m.payload for m in await member.receive(1)] == [b"j0"]
        await member.disconnect()
        await pub.publish("jobs", "j1", 1)  # while the group has no member
        assert "$share/g/jobs" not in gw.mqtt.share_groups
        holder, _ = await RawClient.connected(port, Connect("m2", MQTT_3_1_1))
        holder.send(Subscribe(1, [Subscription("$share/g/jobs", 1)]))
        assert isinstance(await holder.recv(), SubAck)
        assert (await holder.recv()).payload == b"j1"  # (not acknowledged)
        await holder.close()
        back = PahoClient(port, "m3")
        await back.connect()
        await back.subscribe("$share/g/jobs", 1)
        assert [m.payload for m in await back.receive(1)] == [b"j1"]  # given back, kept meanwhile
        await back.nothing_more()
        await back.disconnect()
        assert "$share/g/jobs" not in gw.mqtt.share_groups
        await pub.disconnect()


async def test_a_shared_message_removed_by_retention_does_not_hold_the_group_back(data_dir: Path) -> None:
    """A member leaves without acknowledging a message that retention removed meanwhile: the
    group has nothing to give again, and its committed offset moves past it (it used to stay
    at that offset for good, and a restart delivered everything after it again)."""
    async with running_gateway(data_dir, segment_size=8192, retention_bytes=20_000, retention_hours=0) as gw:
        port = mqtt_port(gw)
        leaver, _ = await RawClient.connected(port, Connect("m1", MQTT_3_1_1))
        leaver.send(Subscribe(1, [Subscription("$share/g/jobs", 1)]))
        assert isinstance(await leaver.recv(), SubAck)
        pub = PahoClient(port, "pub")
        await pub.connect()
        await pub.publish("jobs", "j0", 1)
        assert (await leaver.recv()).payload == b"j0"  # (not acknowledged)
        for i in range(60):  # 60 KB elsewhere: the segment of j0 goes
            await pub.publish("filler", bytes(1000), 1)
        assert await gw.store.apply_retention() > 0
        stayer = PahoClient(port, "m2")
        await stayer.connect()
        await stayer.subscribe("$share/g/jobs", 1)
        await leaver.close()
        await pub.publish("jobs", "j1", 1)
        assert [m.payload for m in await stayer.receive(1)] == [b"j1"]
        await stayer.nothing_more()
        await pub.disconnect()  # (a loop turn after the PUBACK of j1: the group's offset is saved)
        assert gw.store.get_offset_now("$share/g/jobs", "t:jobs") == 2
        await stayer.disconnect()


async def test_delivery_leaves_the_shared_store_records_as_the_store_made_them(data_dir: Path) -> None:
    """The queue cache hands one StoredMessage to every subscriber of a queue, to be treated as
    read-only: what the MQTT gateway derives from a message (its decoding, the PUBLISH bytes)
    is kept beside the record, not written into it (the store layer carries no reader's view)."""
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        sub = PahoClient(port, "sub", version=MQTT_5)
        pub = PahoClient(port, "pub", version=MQTT_5)
        await sub.connect()
        await pub.connect()
        await sub.subscribe("rec/+", 1)
        for i in range(5):
            await pub.publish(f"rec/{i}", f"m{i}", 1)
        assert len(await sub.receive(5)) == 5
        queue = queue_for_filter("rec/+")
        cached = gw.mqtt.cache.read(queue, 0, 10).messages  # the objects the subscriber was given
        fresh = gw.store.get_now(queue, 0, 10).messages
        assert len(cached) == len(fresh) == 5
        for message in cached + fresh:
            assert message.properties  # (the store's own lazy decoding, the same on both)
        # every field, the decoded properties too (StoredMessage.__eq__ compares the stored fields)
        assert cached == fresh and [m.properties for m in cached] == [m.properties for m in fresh]
        await sub.disconnect()
        await pub.disconnect()


async def test_fan_in_from_several_publishers_reaches_the_subscriber_once_and_in_order(data_dir: Path) -> None:
    """Four publishers at once into one wildcard subscriber (QoS 1) and one at QoS 0: each gets
    every message once, each publisher's in its order, the newest taken as committed (the
    store writes through to the cache window at the queue's end, store/read/tail.py)."""
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        subs = [PahoClient(port, f"sub{qos}") for qos in (0, 1)]
        for qos, sub in enumerate(subs):
            await sub.connect()
            await sub.subscribe("fan/+", qos)
        pubs = [PahoClient(port, f"pub{k}") for k in range(4)]
        for pub in pubs:
            await pub.connect()

        async def publish(k: int) -> None:
            for i in range(60):
                await pubs[k].publish(f"fan/p{k}", f"{k}:{i}", 1)

        await asyncio.gather(*(publish(k) for k in range(4)))
        for sub in subs:
            got = await sub.receive(240)
            for k in range(4):
                assert [m.payload for m in got if m.topic == f"fan/p{k}"] == [f"{k}:{i}".encode() for i in range(60)]
            await sub.nothing_more(0.3)
        assert gw.mqtt.cache.stats.messages_written_through > 0
        for client in subs + pubs:
            await client.disconnect()
