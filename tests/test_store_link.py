"""The store link: a RemoteStore on a real socket against a store node (``role = "store"``),
and the codec's handling of bad bodies. What a gateway node writes is in the store node's
store, and what other clients write there reaches the gateway node's reads and notify."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cache import QueueCache
from gateway.cluster.gateway_store import GatewayStore
from gateway.cluster.link import Link
from gateway.cluster.remote_store import RemoteStore, RemoteStoreError
from gateway.cluster.store_link import (
    StoreCode,
    StoreLinkError,
    WILDCARD_TARGETS,
    decode_messages,
    decode_put,
    encode_put,
)
from gateway.config import Config, ConfigError, load_config
from gateway.server import Gateway
from protocols.remoting.codes import ResponseCode
from store import GetStatus, Message


def remoting_port(gw: Gateway) -> int:
    return next(listener.address[1] for listener in gw.listeners if listener.protocol == "remoting")


async def test_remote_store_puts_reads_offsets_kv_and_notify(data_dir: Path) -> None:
    gw = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0"))
    await gw.start()
    remote = await RemoteStore.connect("127.0.0.1", remoting_port(gw))
    try:
        assert remote.msg_id_prefix == gw.store.msg_id_prefix
        events: list[dict[str, int]] = []
        await remote.subscribe_notify(events.append, "node-1")
        remote.interest("t:a/b", True)  # notify events of the queues this node reads, only

        results = await remote.put_batch([
            (Message("a/b", b"one", {"p": "1"}, key="k1"), ["t:a/b", "w:a/+"]),
            (Message("a/b", b"two", tags="TagA"), ["t:a/b"]),
        ])
        assert [r.queue_offsets for r in results] == [{"t:a/b": 0, "w:a/+": 0}, {"t:a/b": 1}]
        assert results[0].msg_id == f"{gw.store.msg_id_prefix}{results[0].position:016X}"
        local = gw.store.get_now("t:a/b", 0, 10)  # written once, in the store node's store
        assert [(m.body, m.key, m.msg_id) for m in local.messages] == [
            (b"one", "k1", results[0].msg_id), (b"two", "", results[1].msg_id)]

        got = await remote.get("t:a/b", 0, 10)
        assert got.status is GetStatus.FOUND and (got.next_offset, got.min_offset, got.max_offset) == (2, 0, 2)
        assert [(m.body, m.properties, m.queue_offset, m.msg_id) for m in got.messages] == [
            (b"one", {"p": "1"}, 0, results[0].msg_id), (b"two", {"TAGS": "TagA"}, 1, results[1].msg_id)]
        assert (await remote.get("t:a/b", 2)).status is GetStatus.NO_NEW_MESSAGE
        assert (await remote.get("t:nothing", 0)).status is GetStatus.NO_SUCH_QUEUE
        filtered = await remote.get("t:a/b", 0, 10, tag_hashes=frozenset({got.messages[1].tag_hash}))
        assert [m.body for m in filtered.messages] == [b"two"]
        assert (await remote.read_at(results[1].position)).body == b"two"
        assert await remote.read_at(1 << 40) is None
        assert await remote.offsets(["t:a/b", "w:a/+", "t:none"]) == {"t:a/b": (0, 2), "w:a/+": (0, 1),
                                                                      "t:none": (0, 0)}

        await remote.commit_offset("session-1", "t:a/b", 1)
        assert await remote.get_offset("session-1", "t:a/b") == 1
        assert gw.store.get_offset_now("session-1", "t:a/b") == 1
        assert await remote.get_offset("session-1", "t:other") is None
        await remote.kv_put("sessions", "c1", b"state")
        await remote.kv_put("sessions", "c2", b"more")
        assert await remote.kv_get("sessions", "c1") == b"state"
        assert await remote.kv_items("sessions", "c") == [("c1", b"state"), ("c2", b"more")]
        await remote.kv_delete("sessions", "c1")
        assert await remote.kv_get("sessions", "c1") is None

        # another gateway node writes: this one hears of it and reads it
        other = await RemoteStore.connect("127.0.0.1", remoting_port(gw))
        await other.put(Message("a/b", b"three"), ["t:a/b"])
        await other.close()
        for _ in range(100):
            if any(e.get("t:a/b") == 3 for e in events):
                break
            await asyncio.sleep(0.02)
        assert any(e.get("t:a/b") == 3 for e in events)
        assert not any("w:a/+" in e for e in events)  # not read here: not routed here
        assert [m.body for m in (await remote.get("t:a/b", 2)).messages] == [b"three"]

        with pytest.raises(RemoteStoreError):  # a queue with no name: refused, the link stays up
            await remote.put(Message("x", b"y"), [])
        assert (await remote.get("t:a/b", 0, 1)).messages[0].body == b"one"
    finally:
        await remote.close()
        await gw.stop()
    with pytest.raises(RemoteStoreError):
        await remote.get("t:a/b", 0)


def test_role_store_needs_the_remoting_listener() -> None:
    with pytest.raises(ConfigError, match="remoting_bind"):
        load_config(env={}, overrides={"role": "store", "remoting_bind": ""})
    with pytest.raises(ConfigError, match="role"):
        load_config(env={}, overrides={"role": "primary"})


names = st.text(min_size=1, max_size=20)


@given(st.lists(st.tuples(names, st.binary(max_size=64), st.lists(names, min_size=1, max_size=3)), max_size=5))
def test_put_bodies_round_trip(items) -> None:
    messages = [(Message(topic, body, {"k": "v"}, key="key", flag=7), queues) for topic, body, queues in items]
    decoded = decode_put(encode_put(messages))
    assert [(m.topic, m.body, m.key, m.flag, q) for m, q in decoded] == [
        (m.topic, m.body, m.key, m.flag, list(q)) for m, q in messages]


@given(st.binary(max_size=200))
def test_bad_bodies_raise_only_the_codec_error(data: bytes) -> None:
    for decode in (decode_put, lambda d: decode_messages(d, "P", "q")):
        try:
            decode(data)
        except StoreLinkError:
            pass


async def test_cluster_token_keeps_strangers_off_the_store_link(data_dir: Path) -> None:
    gw = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0",
                        cluster_token="s3cret"))
    await gw.start()
    try:
        with pytest.raises(RemoteStoreError, match="wrong cluster token"):
            await RemoteStore.connect("127.0.0.1", remoting_port(gw), token="guess")
        link = await Link.connect("127.0.0.1", remoting_port(gw))  # no HELLO at all
        reply = await link.call(StoreCode.KV_GET, {"table": "mqtt.sessions", "key": "x"})
        assert reply.code == ResponseCode.NO_PERMISSION
        link.close()
        trusted = await RemoteStore.connect("127.0.0.1", remoting_port(gw), token="s3cret")
        await trusted.kv_put("t", "k", b"v")
        assert await trusted.kv_get("t", "k") == b"v"
        await trusted.close()
    finally:
        await gw.stop()


async def test_a_gateway_node_wakes_its_readers_when_the_news_is_already_here(data_dir: Path) -> None:
    """A notify for a queue read on the node is followed by a fetch of the new part, given to
    the node's queue cache, and the node's readers hear of it only then: their first read
    answers from memory. A queue nobody reads on the node is not fetched."""
    gw = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0"))
    await gw.start()
    store = GatewayStore(await RemoteStore.connect("127.0.0.1", remoting_port(gw)))
    cache = store.answers = QueueCache(store)
    writer = await RemoteStore.connect("127.0.0.1", remoting_port(gw))
    try:
        await store.start("node-1")
        await writer.put_batch([(Message("a", b"old"), ["t:a", "t:b"])])
        store.read_here = {"t:a"}  # t:b: interest routed here, but no local reader
        await store.ensure_offsets(["t:a", "t:b"])  # (kept for the queue read here only)
        for queue in ("t:a", "t:b"):
            store.remote.interest(queue, True)
        woken = store.subscribe_notify()
        fetches = store.fetches

        await writer.put_batch([(Message("a", b"new-1"), ["t:a", "t:b"]), (Message("a", b"new-2"), ["t:a", "t:b"])])
        seen: dict[str, int] = {}
        while seen.get("t:a", 0) < 3:
            queue, offset = await asyncio.wait_for(woken.__anext__(), 5)
            seen[queue] = max(offset, seen.get(queue, 0))
            seen.update(woken.drain())
        result = cache.read("t:a", 1, 32)
        assert result.status is GetStatus.FOUND
        assert [m.body for m in result.messages] == [b"new-1", b"new-2"]
        assert store.fetches == fetches + 1  # the one fetch before the wake
        assert cache.read("t:a", 1, 32) == result  # (now from the window)
        store.forget("t:a")  # no reader left here: what the cache holds for it would go stale
        assert cache.window("t:a") is None and cache.stats.bytes == 0
        # t:b was announced too; nothing fetched it, its first read asks the store node
        assert seen.get("t:b") == 3
        assert cache.read("t:b", 1, 32).status is GetStatus.NO_NEW_MESSAGE
    finally:
        await writer.close()
        await store.close()
        await gw.stop()


async def test_a_numbered_put_sent_again_after_the_store_node_restarted_is_written_once(data_dir: Path) -> None:
    """A gateway node's put whose answer a failover took is sent again, numbered as before
    (store/write/idempotence.py): the store node answers it from the put's mark, with its
    positions, and does not store it twice; a bad number is refused, not taken."""
    config = Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0")
    gw = Gateway(config)
    await gw.start()
    items = [(Message("a/b", b"once"), ["t:a/b"])]
    remote = await RemoteStore.connect("127.0.0.1", remoting_port(gw))
    first = await remote.put_batch_nowait(items, queue_offsets=False, producer=("gw-1", 1))
    await remote.close()
    await gw.stop()
    gw = Gateway(config)
    await gw.start()
    try:
        remote = await RemoteStore.connect("127.0.0.1", remoting_port(gw))
        again = await remote.put_batch_nowait(items, queue_offsets=False, producer=("gw-1", 1))
        assert [r.position for r in again] == [r.position for r in first]
        await remote.put_batch_nowait([(Message("a/b", b"next"), ["t:a/b"])], queue_offsets=False, producer=("gw-1", 2))
        assert [m.body for m in gw.store.get_now("t:a/b", 0, 10).messages] == [b"once", b"next"]
        with pytest.raises(RemoteStoreError, match="sequence number"):
            await remote.put_batch_nowait(items, queue_offsets=False, producer=("gw-1", -5))
        assert [m.body for m in gw.store.get_now("t:a/b", 0, 10).messages] == [b"once", b"next"]
        await remote.close()
    finally:
        await gw.stop()


async def test_a_gateway_nodes_clean_session_holds_outlive_the_store_node_until_it_links_again(data_dir: Path) -> None:
    """A clean session's wildcard filter is held for its gateway node's link only -- and written,
    so that a store node serving next (a new leader, a restart) holds it meanwhile: a message
    another node publishes before the holder links again still reaches the filter's queue. Held
    again on the new link, it stays; a node that does not come back loses its holds once
    ``release_unclaimed`` runs (RELINK_S after start)."""
    config = Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0")
    gw = Gateway(config)
    await gw.start()
    holders = []
    for node, topic_filter in (("gw-b", "sensors/+"), ("gw-c", "other/+")):
        remote = await RemoteStore.connect("127.0.0.1", remoting_port(gw))
        await remote.subscribe_notify(lambda events: None, node)
        remote.filter_hold(topic_filter, "clean-1", False)
        await remote.kv_get("t", "x")  # (a round trip: the one-way hold was taken)
        holders.append(remote)
    await gw.stop()  # the store node goes first, with the links open (a failover)
    for remote in holders:
        await remote.close()
    gw = Gateway(config)
    await gw.start()
    try:
        writer = await RemoteStore.connect("127.0.0.1", remoting_port(gw))
        await writer.subscribe_notify(lambda events: None, "gw-a")

        async def publish(topic: str) -> None:
            await writer.put_batch([(Message(topic, b"m"), [f"t:{topic}", WILDCARD_TARGETS])])

        def count(queue: str) -> int:
            return len(gw.store.get_now(queue, 0, 100).messages)

        await publish("sensors/1")  # before gw-b links again
        await publish("other/1")
        assert (count("w:sensors/+"), count("w:other/+")) == (1, 1)
        again = await RemoteStore.connect("127.0.0.1", remoting_port(gw))
        await again.subscribe_notify(lambda events: None, "gw-b")
        again.filter_hold("sensors/+", "clean-1", False)  # said again on its new link
        await again.kv_get("t", "x")
        assert gw.store_service is not None
        gw.store_service.release_unclaimed()  # gw-c did not come back
        await publish("sensors/2")
        await publish("other/2")
        assert (count("w:sensors/+"), count("w:other/+")) == (2, 1)
        await again.close()
        await writer.close()
    finally:
        await gw.stop()
