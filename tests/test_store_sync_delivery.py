"""Sync flush mode: a message is readable (and announced) once written, before its fdatasync;
its put is acknowledged only after the fdatasync; metadata that may name it (consumer offsets,
tables) is never written before it is on disk; a failed fdatasync fails the waiting puts and
stops writes, leaving what readers may have seen in place."""

from __future__ import annotations

import asyncio
import threading

import pytest

from store import GetStatus, Message, StoreWriteError
from store.log.commitlog import CommitLog
from store.write.durable import SyncFlusher

NOT_OPEN = 1 << 20  # a file descriptor number beyond any this process opens


class Hold:
    """Holds the store's flusher: no fdatasync starts while held; ``set()`` starts the one
    asked for meanwhile (with ``fail``, on a file descriptor that is not open: EBADF)."""

    def __init__(self) -> None:
        self.held = True
        self.fail = False
        self.asked: list[SyncFlusher] = []

    def set(self) -> None:
        self.held = False
        asked, self.asked = self.asked, []
        for flusher in asked:
            REQUEST(flusher)

    def clear(self) -> None:
        self.held = True


REQUEST = SyncFlusher._request


@pytest.fixture
def held_flusher(monkeypatch):
    """(hold, None): the flusher thread gets no request while ``hold`` is held (Hold)."""
    hold = Hold()

    real_targets = CommitLog.sync_targets

    def sync_targets(self: CommitLog) -> tuple[int, list[int]]:
        end, fds = real_targets(self)
        return (end, [NOT_OPEN]) if hold.fail else (end, fds)

    def request(self: SyncFlusher) -> None:
        if hold.held:
            self._requested = True  # (as the real one: later batches wait for its answer)
            hold.asked.append(self)
        else:
            REQUEST(self)

    monkeypatch.setattr(SyncFlusher, "_request", request)
    monkeypatch.setattr(CommitLog, "sync_targets", sync_targets)
    return hold, None


async def wait_readable(store, queue: str, offset: int):
    for _ in range(200):
        res = store.get_now(queue, offset)
        if res.status is GetStatus.FOUND:
            return res
        await asyncio.sleep(0.005)
    raise AssertionError(f"{queue}@{offset} never became readable")


async def test_a_message_is_read_before_its_put_is_acknowledged_which_waits_for_the_fdatasync(open_store, held_flusher):
    release, _ = held_flusher
    store = await open_store(flush="sync")
    events = store.subscribe_notify()
    put = asyncio.ensure_future(store.put(Message("t", b"early"), ["q"]))
    res = await wait_readable(store, "q", 0)
    assert [m.body for m in res.messages] == [b"early"]
    assert await asyncio.wait_for(events.__anext__(), 5) == ("q", 1)
    assert not put.done()  # the acknowledgement still waits for the disk
    assert store.commitlog.flushed_position < store.commitlog.end_position
    release.set()
    result = await asyncio.wait_for(put, 5)
    assert result.queue_offsets == {"q": 0}
    assert store.commitlog.flushed_position == store.commitlog.end_position


async def test_acknowledgements_keep_their_order_across_fdatasyncs(open_store, held_flusher):
    release, _ = held_flusher
    store = await open_store(flush="sync")
    done: list[int] = []
    puts = []
    for i in range(5):  # the first fdatasync is held: the others are written meanwhile
        fut = store.put_batch_nowait([(Message("t", b"%d" % i), ["q"])])
        fut.add_done_callback(lambda _, i=i: done.append(i))
        puts.append(fut)
        await wait_readable(store, "q", i)
    release.set()
    await asyncio.wait_for(asyncio.gather(*puts), 5)
    assert done == [0, 1, 2, 3, 4]


async def test_offsets_and_tables_are_written_only_after_the_messages_they_may_name(open_store, held_flusher):
    release, _ = held_flusher
    store = await open_store(flush="sync")
    put = asyncio.ensure_future(store.put(Message("t", b"x"), ["q"]))
    await wait_readable(store, "q", 0)  # a reader took it, before its fdatasync
    end = store.commitlog.end_position
    assert store.commitlog.flushed_position < end
    durable_at_write: list[int] = []

    class Spy:  # the meta store's RocksDB, noting how far the commitlog is durable at each write
        def __init__(self, db) -> None:
            self.db = db

        def __getattr__(self, name: str):
            return getattr(self.db, name)

        def write(self, batch, *args):
            durable_at_write.append(store.commitlog.flushed_position)
            return self.db.write(batch, *args)

    store.meta._db = store.meta.writes.db = Spy(store.meta._db)
    store.commit_offset_now("reader", "q", 1)
    store._checkpoint_offsets_now()  # the periodic checkpoint
    assert durable_at_write == [end]
    store.save_offset_now("other", "q", 1)
    assert store.get_offset_now("reader", "q") == 1
    release.set()
    await asyncio.wait_for(put, 5)


async def test_a_table_write_makes_the_commitlog_durable_first(open_store, held_flusher):
    release, _ = held_flusher
    store = await open_store(flush="sync")
    put = asyncio.ensure_future(store.put(Message("t", b"x"), ["q"]))
    await wait_readable(store, "q", 0)
    assert store.commitlog.flushed_position < store.commitlog.end_position
    store.table("sessions").put("c1", b"offset q=1")
    assert store.commitlog.flushed_position == store.commitlog.end_position
    release.set()
    await asyncio.wait_for(put, 5)


async def test_a_failed_fdatasync_fails_the_waiting_puts_and_stops_writes(open_store, held_flusher):
    release, _ = held_flusher
    store = await open_store(flush="sync")
    first = asyncio.ensure_future(store.put(Message("t", b"a"), ["q"]))
    await wait_readable(store, "q", 0)
    second = asyncio.ensure_future(store.put(Message("t", b"b"), ["q"]))
    await wait_readable(store, "q", 1)
    release.fail = True
    release.set()
    for put in (first, second):
        with pytest.raises(StoreWriteError, match="failed fdatasync: Bad file descriptor"):
            await asyncio.wait_for(put, 5)
    # Readers may have had them: they stay, and nothing may follow them in the log.
    assert [m.body for m in store.get_now("q", 0).messages] == [b"a", b"b"]
    with pytest.raises(StoreWriteError, match="failed fdatasync"):
        await store.put(Message("t", b"c"), ["q"])


async def test_async_mode_acknowledges_at_once_without_the_flusher(open_store, held_flusher):
    store = await open_store(flush="async")
    result = await asyncio.wait_for(store.put(Message("t", b"x"), ["q"]), 5)
    assert result.queue_offsets == {"q": 0}
    assert not any(t.name == "store-flusher" for t in threading.enumerate())
