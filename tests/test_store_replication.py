"""Commitlog replication between real stores over loopback sockets (store/replica/): a follower
holds the leader's bytes at the leader's positions and reads back the same messages; a
rejoining replica cuts the tail its old epoch wrote and no leader confirmed; older epochs are
fenced off."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import GetStatus, InvalidMessageError, Message, MessageStore, NotLeaderError, NotReplicatedError, StoreOptions
from store.meta.journal import PUT, MetaBatch
from store.replica.epochs import EpochHistory, common_end
from store.replica.link import InSyncSet
from store.replica.node import ReplicaNode, ReplicaSettings
from store.clock import now_ms
from store.errors import StoreWriteError
from store.holds.codec import HOLD_TOPIC, TIMER
from store.log.record import encode_record
from store.rocks import raw_keys
from store.write.idempotence import KEEP_MIN


async def _open(path: Path, **options) -> MessageStore:
    options.setdefault("segment_size", 64 << 10)
    return await MessageStore.open(StoreOptions(data_dir=path, **options))


async def _read_all(store: MessageStore, queue: str) -> list[bytes]:
    out, offset = [], 0
    while True:
        res = await store.get(queue, offset, 256)
        if res.status is GetStatus.OFFSET_TOO_SMALL:  # (retention took the start: read from the oldest kept)
            offset = res.next_offset
            continue
        if res.status is not GetStatus.FOUND:
            return out
        out.extend(m.body for m in res.messages)
        offset = res.next_offset


def _log_bytes(store: MessageStore) -> bytes:
    return b"".join(store.commitlog.read(seg.start, seg.length) for seg in store.commitlog.segments())


class Group:
    """A leader and its followers in this process, each a real store in its own directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stores: dict[str, MessageStore] = {}
        self.nodes: dict[str, ReplicaNode] = {}
        self.in_sync = InSyncSet()
        self.port = 0

    async def open(self, name: str, *, mode="sync", min_insync=1, **options) -> MessageStore:
        self.stores[name] = store = await _open(self.root / name, replicated=True, **options)
        settings = ReplicaSettings(name, mode=mode, min_insync=min_insync, lag_s=1.0, timeout_s=3.0)
        self.nodes[name] = ReplicaNode(store, settings, self.in_sync)
        return store

    async def lead(self, name: str, epoch: int) -> ReplicaNode:
        node = self.nodes[name]
        self.in_sync.members -= {name}  # (as the group's state in etcd: the leader is not its own follower)
        self.port = await node.lead(epoch, "127.0.0.1", 0)
        return node

    async def follow(self, name: str) -> ReplicaNode:
        node = self.nodes[name]
        node.on_seeded = lambda: asyncio.get_running_loop().create_task(self._reopen(name))
        await node.follow(lambda: ("127.0.0.1", self.port))
        return node

    async def _reopen(self, name: str) -> None:
        """As a store node does once its seed is complete: the store opened again, then following."""
        old = self.nodes[name]
        await old.stop()
        options = self.stores[name].options
        await self.stores[name].close()
        self.stores[name] = store = await MessageStore.open(options)
        self.nodes[name] = ReplicaNode(store, old.settings, self.in_sync)
        await self.follow(name)

    async def three(self, min_insync: int) -> MessageStore:
        """a leads epoch 1, b and c follow and are in sync; a's store."""
        a = await self.open("a", min_insync=min_insync)
        await self.open("b", min_insync=min_insync)
        await self.open("c", min_insync=min_insync)
        await self.lead("a", 1)
        for name in ("b", "c"):
            await self.follow(name)
        for name in ("b", "c"):
            await self.in_sync_with(name)
        return a

    async def in_sync_with(self, name: str, timeout: float = 10.0) -> None:
        """Until the leader has added ``name`` to the in-sync set (it holds all that is confirmed)."""
        async with asyncio.timeout(timeout):
            while name not in self.in_sync.members:
                await asyncio.sleep(0.01)

    async def stop(self, name: str) -> None:
        await self.nodes.pop(name).stop()
        await self.stores.pop(name).close()

    async def caught_up(self, name: str, timeout: float = 10.0) -> None:
        leader = next(n.store for n in self.nodes.values() if n.role == "leader")
        store = self.stores[name]
        async with asyncio.timeout(timeout):  # (a follower indexes what the leader says is confirmed)
            while store.commitlog.end_position < leader.commitlog.end_position or \
                    store.index.dispatched_position < leader.index.dispatched_position or \
                    store.meta_replay.applied < leader.meta_replay.applied:
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        for name in list(self.nodes):
            await self.stop(name)


@pytest.fixture
async def group(tmp_path: Path):
    g = Group(tmp_path)
    yield g
    await g.close()


async def _put_many(store: MessageStore, n: int, prefix: str = "m", queues: int = 5) -> list[tuple[str, bytes]]:
    sent = []
    for start in range(0, n, 50):
        items = []
        for i in range(start, min(n, start + 50)):
            queue = f"q{i % queues}"
            body = f"{prefix}{i}".encode() + os.urandom(i % 700)
            items.append((Message("t", body), [queue]))
            sent.append((queue, body))
        await store.put_batch(items)
    return sent


async def test_a_follower_holds_the_leaders_bytes_and_reads_the_same_messages(group):
    leader = await group.open("a")
    follower = await group.open("b")
    await group.lead("a", 1)
    await group.follow("b")
    sent = await _put_many(leader, 3000)  # ~1 MiB: several 64 KiB segments, so rolls are replicated
    await group.caught_up("b")
    assert len(leader.commitlog.segments()) > 5
    assert [s.start for s in follower.commitlog.segments()] == [s.start for s in leader.commitlog.segments()]
    assert _log_bytes(follower) == _log_bytes(leader)
    for q in range(5):
        expected = [body for queue, body in sent if queue == f"q{q}"]
        assert await _read_all(follower, f"q{q}") == expected
    with pytest.raises(NotLeaderError):
        await follower.put(Message("t", b"x"), ["q0"])


async def test_a_restarted_follower_goes_on_from_its_own_end(group):
    await group.open("a")
    await group.open("b")
    await group.lead("a", 1)
    await group.follow("b")
    sent = await _put_many(group.stores["a"], 500)
    await group.caught_up("b")
    await group.stop("b")
    sent += await _put_many(group.stores["a"], 500, prefix="n")
    follower = await group.open("b")
    await group.follow("b")
    await group.caught_up("b")
    assert _log_bytes(follower) == _log_bytes(group.stores["a"])
    assert await _read_all(follower, "q1") == [body for queue, body in sent if queue == "q1"]


async def test_a_restarted_follower_shows_only_what_was_confirmed(group):
    """b holds a record the group has not confirmed (c, in sync, lacks it) and restarts: its
    recovery must not show that record (the group may still lose it); b shows it once the
    leader says it is confirmed."""
    a = await group.three(min_insync=3)
    await a.put(Message("t", b"one"), ["q"])
    await group.caught_up("b")
    await group.nodes["c"].follower.stop()  # c is silent, still in sync for lag_s
    one_end = a.commitlog.end_position
    pending = asyncio.ensure_future(a.put(Message("t", b"two"), ["q"]))
    async with asyncio.timeout(5):
        while not one_end < a.commitlog.end_position == group.stores["b"].commitlog.end_position:
            await asyncio.sleep(0.01)
    await group.stop("b")
    b = await group.open("b", min_insync=3)
    assert b.commitlog.end_position == a.commitlog.end_position  # it holds the record ...
    assert await _read_all(b, "q") == [b"one"]  # ... and does not show it
    assert not pending.done()
    await group.follow("b")
    await group.follow("c")
    await pending
    await group.caught_up("b")
    assert await _read_all(b, "q") == [b"one", b"two"]


class SlowInSyncSet(InSyncSet):
    """As etcd's: the compare-and-swap takes a round trip before the members change."""

    def __init__(self) -> None:
        super().__init__()
        self.joining = asyncio.Event()

    async def replace(self, old: frozenset[str], new: frozenset[str]) -> bool:
        if self.members != old:
            return False
        if new - old:
            self.joining.set()
        await asyncio.sleep(0.3)
        return await super().replace(old, new)


async def test_a_follower_joining_the_in_sync_set_holds_every_write_acknowledged_meanwhile(group):
    """While the leader's request to add c to the in-sync set is on its way, c counts as in
    sync: a write is acknowledged only once c holds it too (else c, in sync once the request
    lands, could be elected without it)."""
    group.in_sync = SlowInSyncSet()
    a = await group.open("a", min_insync=2)
    await group.open("b", min_insync=2)
    c = await group.open("c", min_insync=2)
    await group.lead("a", 1)
    await group.follow("b")
    await group.in_sync_with("b")
    await a.put(Message("t", b"one"), ["q"])
    group.in_sync.joining.clear()
    await group.follow("c")
    await group.in_sync.joining.wait()  # the leader asked to add c
    await group.nodes["c"].follower.stop()  # c falls silent for a moment
    pending = asyncio.ensure_future(a.put(Message("t", b"two"), ["q"]))
    await group.in_sync_with("c")
    await asyncio.sleep(0.2)
    assert not pending.done(), "acknowledged while a member of the in-sync set lacks it"
    await group.follow("c")
    result = await pending
    assert c.commitlog.end_position >= result.position + result.size


async def test_a_deposed_leader_cuts_the_tail_no_one_confirmed(group):
    """a leads epoch 1; b follows, then a writes alone (b stopped); b becomes leader of epoch 2
    and takes new writes; a rejoins as follower: its unconfirmed epoch-1 tail is cut and it
    ends with b's log, byte for byte."""
    a = await group.open("a", mode="async")
    b = await group.open("b", mode="async")
    await group.lead("a", 1)
    await group.follow("b")
    shared = await _put_many(a, 300)
    await group.caught_up("b")
    a.meta.table("sessions").put("kept", b"1")
    a.meta.table("sessions").put("changed", b"old")
    shared += await _put_many(a, 10, prefix="sync")
    await group.caught_up("b")
    await group.nodes["b"].stop()
    await _put_many(a, 200, prefix="lost")  # never replicated (async mode: acknowledged alone)
    sessions = a.meta.table("sessions")
    sessions.put("changed", b"new")  # meta changes of the lost tail: undone when it is cut
    sessions.put("added", b"x")
    sessions.delete("kept")
    a.meta.delete_offsets("nobody")
    await group.nodes["a"].stop()
    await group.lead("b", 2)
    newer = await _put_many(b, 300, prefix="new")
    await group.follow("a")
    await group.caught_up("a")
    assert _log_bytes(a) == _log_bytes(b)
    assert a.epochs.entries == b.epochs.entries == [(1, 0), (2, b.epochs.entries[1][1])]
    expected = [body for queue, body in shared + newer if queue == "q3"]
    assert await _read_all(a, "q3") == expected
    assert not any(body.startswith(b"lost") for body in await _read_all(a, "q3"))
    assert dict(a.meta.table("sessions").items()) == dict(b.meta.table("sessions").items()) == \
        {"kept": b"1", "changed": b"old"}


async def test_a_leader_of_an_older_epoch_is_refused(group):
    a = await group.open("a")
    b = await group.open("b")
    await group.lead("b", 5)  # b has seen epoch 5
    await group.lead("a", 3)
    node = await group.follow("b")
    service = node.follower
    await _put_many(a, 10)
    async with asyncio.timeout(5):
        while service.refused is None:
            await asyncio.sleep(0.01)
    assert "newer than this leader" in service.refused
    assert b.commitlog.end_position == 0


async def test_sync_replication_acknowledges_and_shows_only_what_the_in_sync_replicas_hold(group):
    a = await group.open("a", min_insync=2)
    await group.open("b", min_insync=2)
    await group.lead("a", 1)
    with pytest.raises(NotReplicatedError):  # alone: fewer than min_insync replicas in sync
        await asyncio.sleep(0.2)
        await a.put(Message("t", b"alone"), ["q"])
    await group.follow("b")
    await group.in_sync_with("b")
    await a.put(Message("t", b"one"), ["q"])  # acknowledged: b holds it
    assert group.stores["b"].commitlog.end_position >= a.commitlog.end_position
    await group.caught_up("b")  # (and shows it once it hears that it is confirmed)
    assert await _read_all(group.stores["b"], "q") == [b"one"]
    await group.nodes["b"].follower.stop()  # b is silent but still in sync for lag_s
    pending = asyncio.ensure_future(a.put(Message("t", b"two"), ["q"]))
    await asyncio.sleep(0.3)
    assert not pending.done()
    assert await _read_all(a, "q") == [b"one"]  # not shown before it is confirmed
    await group.follow("b")
    await pending
    assert await _read_all(a, "q") == [b"one", b"two"]
    await group.nodes["b"].follower.stop()
    with pytest.raises(NotReplicatedError):  # b leaves the in-sync set after lag_s: refused
        for _ in range(100):
            await a.put(Message("t", b"more"), ["q"])
            await asyncio.sleep(0.05)
    assert group.in_sync.members == frozenset()


async def test_meta_changes_reach_the_followers_through_the_log(group):
    """Sessions, offsets, declarations live in meta: a follower holds them as the leader does,
    by the time the leader's write is confirmed, and after the follower restarts."""
    a = await group.open("a", min_insync=2)
    b = await group.open("b", min_insync=2)
    await group.lead("a", 1)
    await group.follow("b")
    await group.in_sync_with("b")
    sessions = a.meta.table("sessions")
    sessions.put("dev-1", b"state-1")
    sessions.put_many([("dev-2", b"state-2"), ("dev-3", b"state-3")])
    a.meta.save_offsets({("group", "q1"): 42})
    await a.meta_settled()  # b holds them; it applies them once it hears they are confirmed
    await group.caught_up("b")
    assert dict(b.meta.table("sessions").items()) == {"dev-1": b"state-1", "dev-2": b"state-2", "dev-3": b"state-3"}
    assert b.meta.load_offset("group", "q1") == 42
    sessions.delete("dev-2")
    a.meta.delete_offsets("group")
    await a.meta_settled()
    await group.caught_up("b")
    assert b.meta.table("sessions").get("dev-2") is None
    assert b.meta.load_offset("group", "q1") is None
    await group.stop("b")
    b = await group.open("b", min_insync=2)
    assert dict(b.meta.table("sessions").items()) == {"dev-1": b"state-1", "dev-3": b"state-3"}


async def test_a_follower_applies_a_confirmed_stretch_of_meta_changes_in_one_write(group):
    """Each meta change is a record of its own on the leader; a follower applies those it learns
    are confirmed together, in one write of its meta database (with ``flush = sync`` one fsync
    of RocksDB's log, on its event loop, rather than one a record), and holds every change."""
    a = await group.open("a", min_insync=2, flush="sync")
    b = await group.open("b", min_insync=2, flush="sync")
    await group.lead("a", 1)
    await group.follow("b")
    await group.in_sync_with("b")
    writes = []
    apply = b.meta.writes.apply
    b.meta.writes.apply = lambda batch, **kw: (writes.append(len(batch.changes)), apply(batch, **kw))[1]
    sessions = a.meta.table("sessions")
    for i in range(200):  # (200 records appended in one turn of the leader's loop)
        sessions.put(f"dev-{i}", b"state-%d" % i)
    await a.meta_settled()
    await group.caught_up("b")
    assert sum(writes) == 200
    assert len(writes) <= 10, writes
    assert dict(b.meta.table("sessions").items()) == {f"dev-{i}": b"state-%d" % i for i in range(200)}


async def test_a_follower_whose_meta_write_failed_indexes_each_record_once_when_it_tries_again(tmp_path):
    """A failed write of a confirmed stretch's meta changes (a full disk) leaves the follower
    where it was; the next attempt adds the stretch again, and nothing of the first attempt is
    indexed twice (a held message counted twice would stay wrong until a restart)."""
    from store.replica.roles import follow

    source = await _open(tmp_path / "src")
    await source.put(Message("t", b"a"), ["q"])
    source.commitlog.append([encode_record(topic=HOLD_TOPIC.encode(), key=b"", properties=b"", queues=[], offsets=[],
                                           body=MetaBatch().put(b"k", b"v").encode(), born_ts=1, store_ts=1)])
    await source.held.put(Message("t", b"later"), ["q"], TIMER, 1 << 50)
    await source.put(Message("t", b"b"), ["q"])
    end = source.commitlog.end_position
    leader_bytes = source.commitlog.read(0, end)
    await source.close()
    replica = await _open(tmp_path / "f", replicated=True)
    try:
        log = follow(replica)
        replica.commitlog.append_at(0, leader_bytes)  # (as the leader's DATA frames write them)
        failures = [StoreWriteError("meta write failed: no space left (test)")]
        apply = replica.meta.writes.apply

        def failing_once(batch, **kw):
            if failures:
                raise failures.pop()
            return apply(batch, **kw)
        replica.meta.writes.apply = failing_once
        log.confirmed = end
        assert replica.held.count(TIMER) == 0  # (counted now, then kept up by the dispatcher's count)
        with pytest.raises(StoreWriteError):
            log.index_confirmed()
        assert log.indexed == 0
        log.index_confirmed()
        assert log.indexed == end
        assert replica.held.count(TIMER) == 1
        assert [m.body for m in replica.get_now("q", 0, 10).messages] == [b"a", b"b"]
        assert replica.meta.db.get(b"k") == b"v"
    finally:
        await replica.close()


async def test_a_lone_meta_change_is_confirmed_when_every_replica_must_fsync(group):
    """flush = "sync": the leader counts only what it has made durable, so a meta change with
    no write after it must be fdatasynced by itself (found by the chaos script)."""
    a = await group.open("a", min_insync=2, flush="sync")
    await group.open("b", min_insync=2, flush="sync")
    await group.lead("a", 1)
    await group.follow("b")
    await group.in_sync_with("b")
    a.meta.table("declarations").put("queue:orders", b"durable")
    async with asyncio.timeout(2):  # (not replication_timeout_s: the fsync is asked at once)
        await a.meta_settled()
    assert a.commitlog.flushed_position == a.commitlog.end_position


async def test_a_leader_alone_shows_its_meta_changes_and_acknowledges_none(group):
    """Fewer than min_insync replicas in sync: a meta change is never acknowledged (a reply to
    it waits and fails), yet a reply that only shows state goes on -- every in-sync replica (the
    leader alone) holds what it shows."""
    a = await group.open("a", min_insync=2)
    await group.open("b", min_insync=2)
    await group.lead("a", 1)
    await group.follow("b")
    await group.in_sync_with("b")
    await group.stop("b")
    behind = asyncio.ensure_future(a.put(Message("t", b"b lacks it"), ["q"]))
    async with asyncio.timeout(5):  # b, behind, leaves the in-sync set after lag_s
        while group.in_sync.members:
            await asyncio.sleep(0.02)
    with pytest.raises(NotReplicatedError):
        await behind
    a.meta.table("sessions").put("dev-1", b"state")
    shown = a.meta_settling(shown=True)
    assert shown is None or await shown is None
    with pytest.raises(NotReplicatedError):
        await a.meta_settled()


async def test_a_promoted_follower_has_the_leaders_state(group):
    a = await group.open("a", min_insync=2)
    b = await group.open("b", min_insync=2)
    await group.lead("a", 1)
    await group.follow("b")
    await group.in_sync_with("b")
    a.meta.table("declarations").put("queue:orders", b"durable")
    sent = await _put_many(a, 200)
    await a.meta_settled()
    await group.stop("a")  # the leader is gone
    group.in_sync.members = frozenset()
    await group.lead("b", 2)
    assert b.meta.table("declarations").get("queue:orders") == b"durable"
    expected = [body for queue, body in sent if queue == "q2"]
    shown = await _read_all(b, "q2")  # what b heard confirmed; the rest once confirmed in epoch 2
    assert shown == expected[:len(shown)]
    with pytest.raises(NotReplicatedError):  # alone: writes refused
        await b.put(Message("t", b"refused"), ["q2"])
    async with asyncio.timeout(5):  # alone in sync, its log is the group's: shown, not acknowledged
        while await _read_all(b, "q2") != expected:
            await asyncio.sleep(0.02)
    await group.open("c", min_insync=2)
    await group.follow("c")  # a second replica: b's tail is confirmed, writes are taken
    await group.in_sync_with("c")
    await b.put(Message("t", b"new"), ["q2"])  # placed after b's tail
    assert await _read_all(b, "q2") == expected + [b"new"]
    b.meta.table("declarations").put("queue:more", b"x")  # b leads: its writes are journaled
    await b.meta_settled()
    await group.caught_up("c")
    assert group.stores["c"].meta.table("declarations").get("queue:more") == b"x"
    assert await _read_all(group.stores["c"], "q2") == expected + [b"new"]


async def test_a_new_leader_drops_an_in_sync_replica_it_never_hears_from(group):
    """The leader and one follower die: the survivor leads with the dead follower still in the
    in-sync set it inherits. It must leave the set (after lag_s), or it would hold the confirmed
    position at 0 for good: the survivor then shows all it holds, and takes writes as soon as
    a second replica is in sync."""
    a = await group.three(min_insync=2)
    sent = await _put_many(a, 100)
    await group.caught_up("b")
    await group.stop("a")
    await group.stop("c")
    group.in_sync.members = frozenset({"c"})  # (as the group's state in etcd: b's epoch inherits c)
    await group.lead("b", 2)
    b = group.stores["b"]
    expected = [body for queue, body in sent if queue == "q0"]
    async with asyncio.timeout(5):
        while group.in_sync.members or await _read_all(b, "q0") != expected:
            await asyncio.sleep(0.02)
    await group.open("d", min_insync=2)
    await group.follow("d")
    await group.in_sync_with("d")
    await b.put(Message("t", b"new"), ["q0"])
    assert await _read_all(b, "q0") == expected + [b"new"]


async def test_a_follower_behind_the_leaders_retention_is_seeded_and_follows(group):
    """A new (or wiped) replica, where the leader's retention removed the log's start: it gets
    the leader's index, meta and segments, opens them, and streams from their end."""
    a = await group.open("a", min_insync=1, retention_bytes=300 << 10)
    await group.lead("a", 1)
    await _put_many(a, 3000)
    a.meta.table("sessions").put("dev-1", b"state")
    a.meta.save_offsets({("group", "q1"): 7})
    await a.apply_retention()
    assert a.commitlog.min_position > 0
    await group.open("b", min_insync=1)
    await group.follow("b")
    async with asyncio.timeout(20):
        while group.stores["b"].commitlog.end_position < a.commitlog.end_position or group.nodes["b"].role != "follower":
            await asyncio.sleep(0.02)
    more = await _put_many(a, 200, prefix="more")
    await group.caught_up("b")
    b = group.stores["b"]
    assert b.commitlog.min_position == a.commitlog.min_position
    assert _log_bytes(b) == _log_bytes(a)
    assert b.epochs.entries == a.epochs.entries
    assert b.meta.table("sessions").get("dev-1") == b"state"
    assert b.meta.load_offset("group", "q1") == 7
    for q in range(5):
        kept = await _read_all(b, f"q{q}")
        assert kept == await _read_all(a, f"q{q}")
        newest = [body for queue, body in more if queue == f"q{q}"]
        assert len(kept) > len(newest) and kept[-len(newest):] == newest
    assert group.nodes["a"].leader.seeds_sent == 1


async def test_a_follower_leaves_a_leader_that_went_silent(group):
    """A leader stopped (SIGSTOP, a frozen VM) keeps its sockets open and sends nothing: its
    follower must not wait on it forever but link again, to whoever leads now."""
    accepted = []

    async def silent(reader, writer):  # accepts, reads the HELLO, answers nothing
        accepted.append(writer)
        await reader.read(1024)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    silent_port = server.sockets[0].getsockname()[1]
    a = await group.open("a", min_insync=1)
    b = await group.open("b", min_insync=1)
    await group.lead("a", 1)
    await _put_many(a, 50)
    where = {"port": silent_port}
    node = group.nodes["b"]
    await node.follow(lambda: ("127.0.0.1", where["port"]))
    async with asyncio.timeout(5):
        while len(accepted) < 2:  # gave up on the silent one and tried again
            await asyncio.sleep(0.05)
    where["port"] = group.port  # the group now knows the real leader
    node.follower.relink()
    await group.caught_up("b")
    assert _log_bytes(b) == _log_bytes(a)
    server.close()
    for writer in accepted:
        writer.close()


async def test_a_follower_without_the_groups_token_gets_nothing(tmp_path):
    """The replication link streams every message, session and offset: with a cluster token, a
    follower that does not present it is refused before any byte of the log."""
    leader = await _open(tmp_path / "a")
    intruder = await _open(tmp_path / "b")
    in_sync = InSyncSet()
    leading = ReplicaNode(leader, ReplicaSettings("a", min_insync=1, token="secret"), in_sync)
    following = ReplicaNode(intruder, ReplicaSettings("b", min_insync=1, token="guess"), in_sync)
    try:
        port = await leading.lead(1, "127.0.0.1", 0)
        await _put_many(leader, 20)
        await following.follow(lambda: ("127.0.0.1", port))
        async with asyncio.timeout(5):
            while following.follower.refused is None:
                await asyncio.sleep(0.01)
        assert following.follower.refused == "wrong replication token"
        assert intruder.commitlog.end_position == 0 and not leading.leader.followers
    finally:
        await following.stop()
        await leading.stop()
        await leader.close()
        await intruder.close()


def test_common_end_is_the_end_of_the_newest_shared_epoch(tmp_path):
    assert common_end([(1, 0), (2, 100)], 150, [(1, 0), (2, 100), (4, 180)], 300) == 150
    assert common_end([(1, 0), (3, 100)], 150, [(1, 0), (2, 100)], 300) == 100
    assert common_end([(1, 0)], 50, [(1, 0), (2, 100)], 200) == 50
    assert common_end([], 0, [(1, 0)], 10) == 0
    history = EpochHistory(tmp_path)
    history.begin(1, 0)
    history.begin(3, 100)
    history.cut(100, [(1, 0), (2, 100), (4, 180)])
    assert EpochHistory(tmp_path).entries == [(1, 0), (2, 100), (4, 180)]
    with pytest.raises(Exception):
        history.begin(4, 200)


@given(st.lists(st.tuples(st.sampled_from(["put", "delete", "range"]), st.binary(min_size=1, max_size=3),
                          st.binary(max_size=4)), max_size=12))
def test_a_journaled_meta_batch_round_trips_and_undoes_exactly(ops):
    before = {b"a": b"1", b"b": b"2", b"\x01": b"x"}
    state = dict(before)
    batch = MetaBatch()
    for op, key, value in ops:
        if op == "put":
            batch.put(key, value)
        elif op == "delete":
            batch.delete(key)
        else:
            batch.delete_range(key, key + b"\xff")
    intended = dict(state)  # what the batch means, applied as RocksDB applies a WriteBatch
    for op, key, value in ops:
        if op == "put":
            intended[key] = value
        elif op == "delete":
            intended.pop(key, None)
        else:
            for k in [k for k in intended if key <= k < key + b"\xff"]:
                del intended[k]
    journaled = batch.with_before(state.get, lambda lo, hi: sorted(k for k in state if lo <= k < hi))
    for op, key, value, _ in MetaBatch.decode(journaled.encode()).changes:  # applied as a follower would
        if op == PUT:
            state[key] = value
        else:
            state.pop(key, None)
    assert state == intended
    for op, key, value, _ in journaled.undo().changes:
        if op == PUT:
            state[key] = value
        else:
            state.pop(key, None)
    assert state == before
    assert MetaBatch.decode(journaled.encode()).changes == journaled.changes


async def test_a_numbered_put_sent_again_to_a_promoted_follower_is_answered_not_written_twice(group):
    """Idempotent puts across a failover (store/write/idempotence.py): a gateway node's put
    whose answer was lost with the leader is sent again to the follower elected in its place,
    which answers it from the mark that followed its records, with the same positions."""
    a = await group.three(min_insync=2)
    first = await a.put_batch_nowait([(Message("t", b"once-%d" % i), ["q"]) for i in range(3)], producer=(b"gw", 7))
    await group.caught_up("b")
    await group.stop("a")
    group.in_sync.members = frozenset({"c"})
    await group.lead("b", 2)
    await group.in_sync_with("c")
    b = group.stores["b"]
    again = await b.put_batch_nowait([(Message("t", b"once-%d" % i), ["q"]) for i in range(3)], producer=(b"gw", 7))
    assert [r.position for r in again] == [r.position for r in first]
    assert [r.size for r in again] == [r.size for r in first]
    new = await b.put_batch_nowait([(Message("t", b"next"), ["q"])], producer=(b"gw", 8))
    assert new[0].position > first[-1].position
    assert await _read_all(b, "q") == [b"once-0", b"once-1", b"once-2", b"next"]


async def test_a_numbered_put_sent_again_while_the_first_is_unanswered_is_written_once(tmp_path):
    store = await _open(tmp_path / "one")
    try:
        items = [(Message("t", b"x"), ["q"])]
        first = store.put_batch_nowait(items, producer=(b"gw", 1))
        second = store.put_batch_nowait(items, producer=(b"gw", 1))
        later = await store.put_batch_nowait(items, producer=(b"gw", 1))  # (answered from its mark)
        assert [r.position for r in await first] == [r.position for r in await second] == [r.position for r in later]
        assert await _read_all(store, "q") == [b"x"]
        other = await store.put_batch_nowait(items, producer=(b"gw2", 1))  # another producer's number 1
        assert other[0].position != later[0].position
        together = [store.put_batch_nowait([(Message("t", b"%d" % seq), ["q"])], producer=(b"gw", seq))
                    for seq in (10, 11, 12)]  # (one commit: one mark for the three)
        firsts = [await f for f in together]
        for seq, first_results in zip((11, 10, 12), (firsts[1], firsts[0], firsts[2])):
            again_results = await store.put_batch_nowait([(Message("t", b"%d" % seq), ["q"])], producer=(b"gw", seq))
            assert again_results[0].position == first_results[0].position
        assert await _read_all(store, "q") == [b"x", b"x", b"10", b"11", b"12"]
        with pytest.raises(InvalidMessageError):
            store.put_batch_nowait(items, producer=(b"", 1))
        with pytest.raises(InvalidMessageError):
            store.put_batch_nowait(items, producer=(b"gw", 0))
    finally:
        await store.close()


async def test_messages_numbered_one_by_one_in_one_put_are_each_answered_when_sent_again(tmp_path):
    """``put_numbered_nowait`` (a relayed AMQP read's publishes): one group commit, one number
    per message; a message sent again alone, while the put is unanswered or after, is answered
    with its own result and not written twice; a refused message leaves its neighbours numbered."""
    store = await _open(tmp_path / "one")
    try:
        items = [(Message("t", b"%d" % seq), ["q"]) for seq in (1, 2, 3)]
        put, refused = store.put_numbered_nowait(items, [(b"ch", 1), (b"ch", 2), (b"ch", 3)])
        assert refused == {}
        while_unanswered = store.put_batch_nowait([items[1]], producer=(b"ch", 2))
        results = await put
        assert [r.position for r in await while_unanswered] == [results[1].position]
        for seq in (3, 1):  # (answered from the commit's mark)
            again = await store.put_batch_nowait([items[seq - 1]], producer=(b"ch", seq))
            assert [r.position for r in again] == [results[seq - 1].position]
        too_large = (Message("t", b"x" * (store.options.max_message_size + 1)), ["q"])
        put, refused = store.put_numbered_nowait([too_large, (Message("t", b"5"), ["q"])], [(b"ch", 4), (b"ch", 5)],
                                                 groups=["a", "b"])
        assert list(refused) == [0]
        (five,) = await put
        again = await store.put_batch_nowait([(Message("t", b"5"), ["q"])], producer=(b"ch", 5))
        assert [r.position for r in again] == [five.position]
        four = await store.put_batch_nowait([(Message("t", b"4"), ["q"])], producer=(b"ch", 4))  # (never stored)
        assert four[0].position > five.position
        assert await _read_all(store, "q") == [b"1", b"2", b"3", b"5", b"4"]
    finally:
        await store.close()


async def test_a_numbered_put_sent_again_is_answered_with_its_first_answer_s_offsets_and_places(tmp_path):
    """Answered from its mark, a put names what its first answer named: the queue offsets its
    record was given, and a held message's nested record (its message id), with no offsets."""
    store = await _open(tmp_path / "one")
    try:
        await store.put_batch_nowait([(Message("t", b"before"), ["q"])])
        first = await store.put_batch_nowait([(Message("t", b"x"), ["q", "q2"])], producer=(b"gw", 1))
        later = Message("t", b"later")
        later.hold_kind, later.hold_due_ms = TIMER, now_ms() + 3_600_000
        held = await store.put_batch_nowait([(later, ["q"])], producer=(b"gw", 2))
        for seq, results in ((1, first), (2, held)):
            again = await store.put_batch_nowait([(Message("t", b"-"), ["q"])], producer=(b"gw", seq))
            assert [(r.position, r.size, r.queue_offsets) for r in again] == \
                [(r.position, r.size, r.queue_offsets) for r in results]
        assert first[0].queue_offsets == {"q": 1, "q2": 0} and held[0].queue_offsets == {}
        assert store.read_at(held[0].position).body == b"later"
    finally:
        await store.close()


async def test_marks_older_than_a_failover_are_forgotten(tmp_path, monkeypatch):
    store = await _open(tmp_path / "one")
    try:
        for seq in (1, 2):
            await store.put_batch_nowait([(Message("t", b"%d" % seq), ["q"])], producer=(b"gw", seq))
        marks = lambda: sum(1 for key in raw_keys(store.meta.db, b"i") if key.startswith(b"i"))  # noqa: E731
        assert marks() == 2
        await store._forget_marks()
        assert marks() == 2  # (recent: kept)
        later = now_ms() + (KEEP_MIN + 1) * 60_000
        monkeypatch.setattr("store.store.now_ms", lambda: later)
        await store._forget_marks()
        assert marks() == 0
        await store.put_batch_nowait([(Message("t", b"1 again"), ["q"])], producer=(b"gw", 1))  # (forgotten: written)
        assert await _read_all(store, "q") == [b"1", b"2", b"1 again"]
    finally:
        await store.close()
