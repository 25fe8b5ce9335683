"""Device presence events through paho-mqtt: a subscriber to ``$SYS/brokers/+/clients/+/+`` sees
each client's connected event and, when its connection ends, its disconnected event with why
(DISCONNECT, a dropped socket, a takeover, keep-alive expiry, a kick, the server's shutdown);
``#`` does not match them, the ACL decides who may subscribe, the setting turns them off, and a
failed event write does not fail the CONNECT; a cluster's gateway nodes store theirs in the store
node. The Spark source reads them, and the example job (``spark_sinks/jobs/device_uptime.py``)
makes uptime per device and day of them."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import pytest

from gateway.http.admin import kick
from gateway.http.deps import Brokers
from gateway.mqtt.presence import PRESENCE_FILTER, PUT_AT_ONCE, presence_topic
from protocols.mqtt.packets import MQTT_5, ConnAck, Connect, Disconnect
from loadtest.clients.mqtt_wire import open_sessions
from store import StoreError
from tests.mqtt_support import PahoClient, RawClient, Received, mqtt_port, running_gateway

NODE = "edge-1"


def event(message: Received) -> tuple[str, str, dict]:
    """(client id level, connected|disconnected, body) of a presence event."""
    levels = message.topic.split("/")
    assert levels[:2] == ["$SYS", "brokers"] and levels[3] == "clients" and len(levels) == 6, message.topic
    assert not message.retain
    return levels[4], levels[5], json.loads(message.payload)


async def watcher(port: int, name: str = "watcher", **kwargs) -> PahoClient:
    """A client subscribed to every presence event, after its own connected event is stored."""
    client = PahoClient(port, name, **kwargs)
    await client.connect()
    await asyncio.sleep(0.2)  # (its own connected event is put asynchronously: let it land first)
    assert (await client.subscribe(PRESENCE_FILTER, 1))[0] in (0, 1)
    return client


async def events_of(client: PahoClient, client_id: str, count: int) -> list[tuple[str, dict]]:
    """The next ``count`` events about ``client_id`` (other clients' are skipped), in order."""
    got: list[tuple[str, dict]] = []
    for _ in range(50):
        if len(got) == count:
            return got
        _, kind, body = event((await client.receive(1))[0])
        if body["clientid"] == client_id:
            got.append((kind, body))
    raise AssertionError(f"{got} of {count} events of {client_id}")


async def test_connect_and_disconnect_carry_the_client_and_why_it_left(data_dir: Path) -> None:
    async with running_gateway(data_dir, node_id=NODE) as gw:
        port = mqtt_port(gw)
        everything = PahoClient(port, "everything")
        await everything.connect()
        await everything.subscribe("#", 1)  # '#' must not match $SYS topics (MQTT 4.7.2)
        watch = await watcher(port)
        ups = PahoClient(port, "ups")
        await ups.connect()
        await ups.subscribe("$SYS/brokers/+/clients/+/connected", 1)
        device = PahoClient(port, "dev/1+x", version=MQTT_5, username="alice", keepalive=30, session_expiry=60)
        await device.connect()
        [(kind, up)] = await events_of(watch, "dev/1+x", 1)
        assert kind == "connected"
        assert {k: up[k] for k in ("clientid", "username", "node", "ipaddress", "proto_name", "proto_ver",
                                   "keepalive", "clean_start", "session_present", "expiry_interval")} == {
            "clientid": "dev/1+x", "username": "alice", "node": NODE, "ipaddress": "127.0.0.1", "proto_name": "MQTT",
            "proto_ver": 5, "keepalive": 30, "clean_start": True, "session_present": False, "expiry_interval": 60}
        assert up["sockport"] == port and up["peername"].startswith("127.0.0.1:")
        assert up["connected_at"] == up["ts"] > 1_700_000_000_000
        await device.disconnect()
        [(kind, down)] = await events_of(watch, "dev/1+x", 1)
        assert kind == "disconnected"
        assert (down["reason"], down["reason_code"], down["will"]) == ("normal", 0, False)
        assert down["connected_at"] == up["connected_at"] <= down["disconnected_at"] == down["ts"]
        assert (down["username"], down["peername"], down["proto_ver"]) == ("alice", up["peername"], 5)
        # the client id is one topic level: '/', '+' (and '#', '%') percent-encoded
        watch.messages.queue.clear()
        again = PahoClient(port, "dev/1+x")
        await again.connect()
        got = await watch.receive(1)
        assert got[0].topic == f"$SYS/brokers/{NODE}/clients/dev%2F1%2Bx/connected"
        await again.disconnect()
        await events_of(watch, "dev/1+x", 1)
        assert [kind for kind, _ in await events_of(ups, "dev/1+x", 2)] == ["connected", "connected"]
        await everything.nothing_more()
        late = await watcher(port, "late")  # not retained: a later subscriber gets none of them
        await late.nothing_more()
        assert gw.mqtt.retained.matching("$SYS/brokers/#") == []
        for client in (everything, watch, ups, late):
            await client.disconnect()


async def test_idle_clients_presence_topics_are_not_remembered_by_the_publish_path(data_dir: Path) -> None:
    """Each client's presence topic is its own and written once a connection: the publish path's
    memo of target queues (for topics published over and over) keeps none of them, so an idle
    connection costs no memo entry; a client's topic is remembered as before."""
    async with running_gateway(data_dir, node_id=NODE) as gw:
        port = mqtt_port(gw)
        watch = await watcher(port)
        clients = [PahoClient(port, f"idle-{i}") for i in range(20)]
        for client in clients:
            await client.connect()
        assert len(await events_of(watch, "idle-19", 1)) == 1  # (stored: the last one's event too)
        clients[0].client.publish("devices/1/state", b"on", qos=1)
        await asyncio.sleep(0.2)
        remembered = list(gw.mqtt.wildcards._memo)  # (the memo itself: what an idle connection would cost)
        assert remembered == ["devices/1/state"]
        for client in (*clients, watch):
            await client.disconnect()


async def test_every_mqtt_reader_gets_them_without_a_queue_per_client(data_dir: Path) -> None:
    """A client's events are indexed into the held filter's queue, not a topic queue of their own
    (one per client id: each idle connection would keep one in the index), unless a subscription
    to exactly that topic exists: then its queue is written too, for a persistent session while
    it is offline as well. Every reader gets them: an exact subscription, a '+' and a '#' filter,
    shared subscriptions of a filter and of one topic."""
    def topic(name: str, kind: str) -> str:
        return presence_topic(NODE, name, kind)

    async with running_gateway(data_dir, node_id=NODE) as gw:
        port = mqtt_port(gw)
        exact = PahoClient(port, "exact", clean=False)
        await exact.connect()
        assert (await exact.subscribe(topic("d2", "connected"), 1))[0] == 1
        await exact.disconnect()  # offline: its session (and subscription) kept
        levels = PahoClient(port, "levels")
        await levels.connect()
        await levels.subscribe("$SYS/brokers/+/clients/#", 1)
        ups = PahoClient(port, "ups")
        await ups.connect()
        await ups.subscribe("$SYS/brokers/+/clients/+/connected", 1)
        shared_all = PahoClient(port, "shared-all")
        await shared_all.connect()
        await shared_all.subscribe(f"$share/g/{PRESENCE_FILTER}", 1)
        shared_one = PahoClient(port, "shared-one")
        await shared_one.connect()
        await shared_one.subscribe(f"$share/h/{topic('d2', 'disconnected')}", 1)
        await asyncio.sleep(0.2)  # (the subscribers' own events land first)
        for name in ("d1", "d2"):
            device = PahoClient(port, name)
            await device.connect()
            await device.disconnect()
        for reader in (levels, shared_all):
            for name in ("d1", "d2"):
                assert [kind for kind, _ in await events_of(reader, name, 2)] == ["connected", "disconnected"]
        for name in ("d1", "d2"):
            assert [kind for kind, _ in await events_of(ups, name, 1)] == ["connected"]
        assert [(m.topic, json.loads(m.payload)["clientid"]) for m in await shared_one.receive(1)] == [
            (topic("d2", "disconnected"), "d2")]
        await exact.connect()  # its session: what came while it was offline
        assert [(m.topic, json.loads(m.payload)["clientid"]) for m in await exact.receive(1)] == [
            (topic("d2", "connected"), "d2")]
        lookup = gw.store.index.lookup
        assert lookup("t:" + topic("d1", "connected")) is None and lookup("t:" + topic("d1", "disconnected")) is None
        assert lookup("t:" + topic("d2", "connected")) is not None  # (read: its exact subscription)
        assert lookup("t:" + topic("d2", "disconnected")) is not None
        for name in ("levels", "ups", "shared-all", "shared-one", "exact"):
            assert lookup("t:" + topic(name, "connected")) is None
        for client in (exact, levels, ups, shared_all, shared_one):
            await client.disconnect()
        await shared_one.nothing_more()


async def test_a_dropped_socket_and_its_will(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        watch = await watcher(port)
        device = PahoClient(port, "dropper", will=("wills/dropper", b"gone", 1))
        await device.connect()
        device.drop()
        [(_, up), (kind, down)] = await events_of(watch, "dropper", 2)
        assert kind == "disconnected" and up["proto_ver"] == 4 and up["clean_start"] is True
        assert (down["reason"], down["reason_code"], down["will"]) == ("tcp_closed", None, True)
        await watch.disconnect()


async def test_a_reset_socket(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        watch = await watcher(port)
        device = PahoClient(port, "resetter")
        await device.connect()
        device.client.loop_stop()
        sock = device.client.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # (linger 0: an RST, not a FIN)
        [_, (kind, down)] = await events_of(watch, "resetter", 2)
        assert (kind, down["reason"], down["reason_code"]) == ("disconnected", "sock_error", None)
        await watch.disconnect()


async def test_a_protocol_error(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        watch = await watcher(port)
        client, ack = await RawClient.connected(port, Connect("broken", MQTT_5))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        client.send_raw(b"\x00\x00")  # packet type 0 is reserved: malformed
        closing = await client.closed()
        assert [p.reason_code for p in closing if isinstance(p, Disconnect)] == [0x81]
        [_, (kind, down)] = await events_of(watch, "broken", 2)
        assert (kind, down["reason"], down["reason_code"]) == ("disconnected", "protocol_error", 0x81)
        await client.close()
        await watch.disconnect()


async def test_takeover_ends_the_old_connection_before_the_new_one_starts(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        watch = await watcher(port)
        first = PahoClient(port, "twin", version=MQTT_5, session_expiry=60)
        await first.connect()
        [(kind, first_up)] = await events_of(watch, "twin", 1)
        first.client.reconnect_delay_set(60, 60)  # (paho must not come back and take it over again)
        second = PahoClient(port, "twin", version=MQTT_5, clean=False, session_expiry=60)
        await second.connect()
        # one wildcard queue: the store's order is the order things happened in
        [(kind1, down), (kind2, second_up)] = await events_of(watch, "twin", 2)
        assert (kind, kind1, kind2) == ("connected", "disconnected", "connected")
        assert (down["reason"], down["reason_code"]) == ("takenover", 0x8E)
        assert down["connected_at"] == first_up["connected_at"] and down["peername"] == first_up["peername"]
        assert second_up["peername"] != first_up["peername"] and second_up["clean_start"] is False
        assert second_up["session_present"] is True
        first.client.loop_stop()
        await second.disconnect()
        await watch.disconnect()


async def test_keep_alive_expiry(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        port = mqtt_port(gw)
        watch = await watcher(port)
        device = PahoClient(port, "sleepy", keepalive=1)
        await device.connect()
        device.client.loop_stop()  # no more PINGREQ; the socket stays open
        [(_, up), (kind, down)] = await events_of(watch, "sleepy", 2)
        assert kind == "disconnected" and up["keepalive"] == 1
        assert (down["reason"], down["reason_code"]) == ("keepalive_timeout", 0x8D)
        assert down["disconnected_at"] - down["connected_at"] >= 1400  # 1.5 times the keep alive (from the CONNECT)
        device.client.socket().close()
        await watch.disconnect()


async def test_a_kick_and_the_server_shutdown(data_dir: Path, open_store) -> None:
    async with running_gateway(data_dir, node_id=NODE) as gw:
        port = mqtt_port(gw)
        watch = await watcher(port)
        device = PahoClient(port, "kicked")
        await device.connect()
        device.client.reconnect_delay_set(60, 60)
        assert kick(Brokers(mqtt=gw.mqtt), "mqtt", "kicked") == {"kicked": "kicked"}
        [_, (kind, down)] = await events_of(watch, "kicked", 2)
        assert (kind, down["reason"], down["reason_code"]) == ("disconnected", "kicked", 0x98)
        device.client.loop_stop()
        watch.client.loop_stop()  # still connected when the gateway stops
    store = await open_store()
    stored = store.get_now("w:" + PRESENCE_FILTER, 0, 100).messages  # (the events' one queue)
    assert [json.loads(m.body)["reason"] for m in stored
            if m.topic == f"$SYS/brokers/{NODE}/clients/watcher/disconnected"] == ["server_shutdown"]


async def test_the_acl_decides_who_subscribes(data_dir: Path, tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("user ops\ntopic read $SYS/brokers/+/clients/#\n"
                   "user dev\ntopic readwrite #\n")  # ('#' does not reach $SYS topics)
    async with running_gateway(data_dir, acl_file=str(acl)) as gw:
        port = mqtt_port(gw)
        nosy = PahoClient(port, "nosy", username="dev")
        await nosy.connect()
        assert [c.value for c in await nosy.subscribe(PRESENCE_FILTER, 1)] == [0x80]
        nosy5 = PahoClient(port, "nosy5", username="dev", version=MQTT_5)
        await nosy5.connect()
        assert [c.value for c in await nosy5.subscribe("$SYS/brokers/+/clients/+/connected", 1)] == [0x87]
        ops = await watcher(port, "ops", username="ops")
        device = PahoClient(port, "seen", username="dev")
        await device.connect()
        [(kind, _)] = await events_of(ops, "seen", 1)
        assert kind == "connected"
        await device.disconnect()
        await nosy.nothing_more()
        for client in (nosy, nosy5, ops):
            await client.disconnect()


async def test_the_setting_turns_them_off(data_dir: Path) -> None:
    async with running_gateway(data_dir, mqtt_presence_events=False) as gw:
        port = mqtt_port(gw)
        watch = await watcher(port)
        device = PahoClient(port, "quiet")
        await device.connect()
        await device.disconnect()
        await watch.nothing_more()
        await watch.disconnect()
        await asyncio.sleep(0.2)
        assert gw.mqtt.wildcards.queues_for("$SYS/brokers/x/clients/quiet/connected") == [
            "t:$SYS/brokers/x/clients/quiet/connected"]  # not held: its subscriber left
        assert gw.store.index.lookup(f"t:$SYS/brokers/{gw.mqtt.presence.node}/clients/quiet/connected") is None
    async with running_gateway(data_dir) as gw:  # on (the default): the filter is held from the start
        assert "w:" + PRESENCE_FILTER in gw.mqtt.wildcards.queues_for("$SYS/brokers/x/clients/quiet/connected")


async def test_a_burst_of_connects_is_written_in_bounded_puts_one_at_a_time(data_dir: Path) -> None:
    """300 clients connecting at once (raw sockets, every handshake started together): every
    event is stored, each client's in order, through puts of at most PUT_AT_ONCE events with one
    in flight -- not 300 puts at once, whose objects would stay in the process's memory."""
    async with running_gateway(data_dir, node_id=NODE) as gw:
        presence = gw.mqtt.presence
        publish, sizes, in_flight, most = presence._publish, [], [0], [0]

        def counted(events: list[tuple[str, bytes]]) -> asyncio.Future:
            written = publish(events)
            sizes.append(len(events))
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            written.add_done_callback(lambda _: in_flight.__setitem__(0, in_flight[0] - 1))
            return written

        presence._publish = counted
        names = [f"burst-{i}" for i in range(300)]
        sessions = await asyncio.to_thread(open_sessions, mqtt_port(gw), names, keep_alive=60, timeout_s=30,
                                           concurrency=len(names))
        try:
            assert len(sessions.sockets) == len(names)
            deadline = time.monotonic() + 10
            while gw.store.max_offset_now("w:" + PRESENCE_FILTER) < len(names):  # (written asynchronously)
                assert time.monotonic() < deadline, gw.store.max_offset_now("w:" + PRESENCE_FILTER)
                await asyncio.sleep(0.05)
        finally:
            for sock in sessions.sockets:
                sock.close()
        assert sum(sizes) == len(names) and max(sizes) <= PUT_AT_ONCE and len(sizes) >= len(names) // PUT_AT_ONCE
        assert most[0] == 1, f"{most[0]} puts of presence events in flight at once"
        deadline = time.monotonic() + 10
        while gw.store.max_offset_now("w:" + PRESENCE_FILTER) < 2 * len(names):  # their disconnected events
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        stored: list = []
        while batch := gw.store.get_now("w:" + PRESENCE_FILTER, len(stored), 100).messages:
            stored.extend(batch)
        kinds: dict[str, list[str]] = {}
        for message in stored:
            levels = message.topic.split("/")
            kinds.setdefault(levels[4], []).append(levels[5])
        assert kinds == {name: ["connected", "disconnected"] for name in names}


@pytest.mark.parametrize("when", ["put", "written"])
async def test_a_failed_event_write_does_not_fail_the_connect(data_dir: Path, caplog, when: str) -> None:
    """The put refused at once, or its future failed later (the store's answer): logged, rate
    limited (a lost store node fails every client's event at once), the client unaffected."""
    async with running_gateway(data_dir) as gw:
        def broken(events: list[tuple[str, bytes]]) -> asyncio.Future:
            if when == "put":
                raise StoreError("the store is gone")
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(StoreError("the store is gone"))
            return failed

        gw.mqtt.presence._publish = broken
        device = PahoClient(mqtt_port(gw), "unlucky")
        with caplog.at_level(logging.ERROR, logger="tidemq.mqtt"):
            _, rc, _ = await device.connect()
            assert rc == 0
            await device.publish("still/works", b"1", qos=1)
            await device.disconnect()
            await asyncio.sleep(0.2)
        errors = [r.getMessage() for r in caplog.records if "presence event not stored" in r.getMessage()]
        assert len(errors) == 1, errors  # (the disconnected one's is counted in the next minute's line)
        assert "client_id=unlucky event=connected" in errors[0] and "the store is gone" in errors[0]
        assert "cause=presence:StoreError count=1" in errors[0]
        assert gw.store.max_offset_now("t:still/works") == 1


async def test_an_amqp_queue_bound_to_them_gets_them(data_dir: Path) -> None:
    """Over amq.topic, as any MQTT topic: routing keys '$SYS.brokers.{node}.clients.{id}.connected'."""
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0", node_id=NODE) as gw:
        amqp = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp}/")
        channel = await conn.channel()
        presence = await channel.declare_queue("presence")
        await presence.bind("amq.topic", "$SYS.brokers.*.clients.*.*")
        device = PahoClient(mqtt_port(gw), "amqp-seen")
        await device.connect()
        await device.disconnect()
        got = []
        for _ in range(100):
            message = await presence.get(fail=False)
            if message is not None:
                got.append((message.routing_key, json.loads(message.body)["clientid"]))
                await message.ack()
            if len(got) == 2:
                break
            await asyncio.sleep(0.05)
        assert got == [(f"$SYS.brokers.{NODE}.clients.amqp-seen.connected", "amqp-seen"),
                       (f"$SYS.brokers.{NODE}.clients.amqp-seen.disconnected", "amqp-seen")]
        await conn.close()


async def test_a_cluster_stores_each_nodes_events_in_the_store_node(data_dir: Path) -> None:
    from tests.test_cluster_mqtt import cluster

    async with cluster(data_dir) as (store, (g0, g1)):
        watch = await watcher(mqtt_port(g1))
        device = PahoClient(mqtt_port(g0), "roamer", clean=False)
        await device.connect()
        device.client.reconnect_delay_set(60, 60)
        moved = PahoClient(mqtt_port(g1), "roamer", clean=False)
        await moved.connect()  # the session moves from g0 to g1
        got = await events_of(watch, "roamer", 3)
        assert [(kind, body["node"], body.get("reason")) for kind, body in got] == [
            ("connected", "g0", None), ("disconnected", "g0", "takenover"), ("connected", "g1", None)]
        assert got[2][1]["session_present"] is True
        # written once, in the store node's store: the topic queue and the held wildcard queue
        assert store.store.max_offset_now("t:$SYS/brokers/g0/clients/roamer/disconnected") == 1
        assert store.store.max_offset_now("w:" + PRESENCE_FILTER) >= 4  # (the watcher's own connected too)
        device.client.loop_stop()
        await moved.disconnect()
        await watch.disconnect()


# -- Spark: the source reads the events; the example job makes uptime per device and day ---------
async def test_the_spark_source_reads_the_events(spark, data_dir: Path) -> None:
    from spark_sinks.jobs.device_uptime import connections, read_events, uptime_per_day

    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", node_id=NODE) as gw:
        port = mqtt_port(gw)
        for name in ("d1", "d2"):
            device = PahoClient(port, name)
            await device.connect()
            await asyncio.sleep(0.02)  # (a connection of 0 ms has no uptime: the job leaves it out)
            await device.disconnect()
        deadline = time.monotonic() + 10
        while gw.store.max_offset_now("w:" + PRESENCE_FILTER) < 4:  # (written asynchronously)
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        address = "{}:{}".format(*gw.metrics_address)
        rows = await asyncio.to_thread(lambda: read_events(spark, address).select("topic", "payload").collect())
        got = [(r.topic, json.loads(r.payload)["clientid"]) for r in rows]
        for name in ("d1", "d2"):  # (each client's in order; d1's end and d2's start may cross)
            assert [g for g in got if g[1] == name] == [(presence_topic(NODE, name, "connected"), name),
                                                        (presence_topic(NODE, name, "disconnected"), name)], got
        assert len(got) == 4, got
        now = int(time.time() * 1000)
        uptime = await asyncio.to_thread(
            lambda: uptime_per_day(connections(read_events(spark, address), now)).collect())
    assert [r.clientid for r in uptime] == ["d1", "d2"]
    today = {datetime.fromtimestamp(t, UTC).date() for t in (now / 1000, now / 1000 - 30)}
    assert {r.day for r in uptime} <= today
    assert all(0 <= r.uptime_s < 30 and r.connections == 1 for r in uptime), uptime


async def test_the_spark_source_reads_a_narrower_filter_from_the_held_queue(spark, data_dir: Path, tmp_path) -> None:
    """A filter narrower than the held one reads the held filter's queue and keeps the rows of its
    topics only, whatever columns the query asks for; a stream's offsets are that queue's, exact
    across a restart from its checkpoint; a topic predicate on the held filter itself is Spark's
    to check on the rows too (the queue holds many topics)."""
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", node_id=NODE) as gw:
        port = mqtt_port(gw)
        address = "{}:{}".format(*gw.metrics_address)
        downs = f"$SYS/brokers/{NODE}/clients/+/disconnected"

        async def come_and_go(*names: str) -> None:
            at = gw.store.max_offset_now("w:" + PRESENCE_FILTER)
            for name in names:
                device = PahoClient(port, name)
                await device.connect()
                await device.disconnect()
            deadline = time.monotonic() + 10
            while gw.store.max_offset_now("w:" + PRESENCE_FILTER) < at + 2 * len(names):  # (written asynchronously)
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)

        def read(topic_filter: str, schema: str | None = None):
            reader = spark.read.format("tidemq")
            if schema is not None:
                reader = reader.schema(schema)
            return reader.options(address=address, topicFilter=topic_filter, startingOffsets="earliest").load()

        await come_and_go("d1", "d2")
        rows = await asyncio.to_thread(lambda: read(downs).select("queue", "topic", "payload").collect())
        assert sorted((r.queue, r.topic, json.loads(r.payload)["clientid"]) for r in rows) == [
            ("w:" + PRESENCE_FILTER, presence_topic(NODE, name, "disconnected"), name) for name in ("d1", "d2")]
        rows = await asyncio.to_thread(lambda: read(downs, "payload BINARY").collect())  # (no topic column)
        assert sorted(json.loads(r.payload)["reason"] + json.loads(r.payload)["clientid"] for r in rows) == [
            "normald1", "normald2"]
        one = presence_topic(NODE, "d1", "connected")
        assert await asyncio.to_thread(lambda: read(PRESENCE_FILTER).where(f"topic = '{one}'").count()) == 1

        def stream() -> list[tuple[str, int]]:
            out: list[tuple[str, int]] = []
            query = (spark.readStream.format("tidemq").options(address=address, topicFilter=downs,
                                                                startingOffsets="earliest").load()
                     .writeStream.foreachBatch(lambda batch, _: out.extend(
                         (json.loads(r.payload)["clientid"], r.offset) for r in batch.collect()))
                     .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ckpt")).start())
            query.awaitTermination(120)
            assert query.exception() is None
            return sorted(out)

        first = await asyncio.to_thread(stream)
        assert [name for name, _ in first] == ["d1", "d2"]
        await come_and_go("d3")
        again = await asyncio.to_thread(stream)  # (from the checkpoint: d3's event alone, once)
        assert [name for name, _ in again] == ["d3"] and again[0][1] > max(offset for _, offset in first)


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def up(client: str, node: str, at: str) -> tuple[str, bytes]:
    body = {"clientid": client, "node": node, "connected_at": ms(at), "ts": ms(at)}
    return presence_topic(node, client, "connected"), json.dumps(body).encode()


def down(client: str, node: str, since: str, at: str, reason: str = "normal") -> tuple[str, bytes]:
    body = {"clientid": client, "node": node, "reason": reason, "connected_at": ms(since), "disconnected_at": ms(at)}
    return presence_topic(node, client, "disconnected"), json.dumps(body).encode()


def test_the_uptime_job_on_a_small_set(spark) -> None:
    from spark_sinks.jobs.device_uptime import connections, uptime_per_day

    events = [
        up("d1", "n1", "2026-01-01T23:00:00"), down("d1", "n1", "2026-01-01T23:00:00", "2026-01-02T01:00:00"),
        # a takeover by a connection on another node: the two overlap by 0.5 s, counted once
        up("d1", "n1", "2026-01-02T10:00:00"), up("d1", "n2", "2026-01-02T10:30:00"),
        down("d1", "n1", "2026-01-02T10:00:00", "2026-01-02T10:30:00.500", "takenover"),
        down("d1", "n2", "2026-01-02T10:30:00", "2026-01-02T11:00:00"),
        # no disconnected events (its gateway was killed, then it is still connected): the first
        # connection ends at the second, the second at as_of
        up("d2", "n1", "2026-01-03T12:00:00"), up("d2", "n1", "2026-01-03T13:00:00"),
        # a disconnected event whose connected one is not read (retention): its start is in it
        down("fleet/d3", "n1", "2026-01-02T23:59:50", "2026-01-03T00:00:10", "keepalive_timeout"),
        ("$SYS/brokers/n1/clients/d4/connected", b"not json"),
    ]
    df = spark.createDataFrame(events, "topic string, payload binary")
    rows = uptime_per_day(connections(df, ms("2026-01-03T14:00:00"))).collect()
    assert [(r.clientid, r.day.isoformat(), r.uptime_s, r.connections) for r in rows] == [
        ("d1", "2026-01-01", 3600.0, 1), ("d1", "2026-01-02", 7200.0, 3), ("d2", "2026-01-03", 7200.0, 2),
        ("fleet/d3", "2026-01-02", 10.0, 1), ("fleet/d3", "2026-01-03", 10.0, 1)]


def test_the_uptime_job_has_a_command_line() -> None:
    out = subprocess.run([sys.executable, "-m", "spark_sinks.jobs.device_uptime", "--help"], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    assert "--address" in out and "--as-of" in out
