"""Idle light queues removed (store/retention/reclaim.py) and per-queue retention (store/retention/queues.py),
at the store: which queues go, that a name written again starts a new queue, and that both
survive a crash the same way (the drop records re-dispatched)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from store import GetStatus, InvalidMessageError, Message
from store.holds.codec import HOLD_TOPIC

ROOT = Path(__file__).resolve().parent.parent


class Policy:
    """Light queues are those starting with ``t:``; rules by queue name."""

    def __init__(self, ttl_s: float = 60.0, rules: dict[str, tuple[float, int]] | None = None) -> None:
        self.ttl_s = ttl_s
        self.rules = rules or {}
        self.has_rules = bool(self.rules)
        self.light_prefixes = ("t:",)
        self.longest_hours = max((h for h, _ in self.rules.values()), default=0.0)

    def idle_ttl_s(self, queue: str) -> float:
        return self.ttl_s if queue.startswith("t:") else 0.0

    def retention(self, queue: str) -> tuple[float, int] | None:
        return self.rules.get(queue)


async def test_idle_unread_light_queues_go_and_read_ones_stay(open_store):
    store = await open_store()
    for queue in ("t:idle", "t:subscribed", "t:consumed", "t:fresh", "amqp-like"):
        await store.put_batch([(Message("x", f"{queue}-{i}".encode()), [queue]) for i in range(3)])
    store.commit_offset_now("group", "t:consumed", 1)
    store.set_queue_policy(Policy(ttl_s=60.0))
    store.reclaimer.checks.append(lambda name: name == "t:subscribed")
    forgotten: list[str] = []
    store.reclaimer.on_removed.append(forgotten.append)

    assert await store.reclaimer.run() == 0  # nothing idle yet
    later = time.time() + 120
    await store.put(Message("x", b"new"), ["t:fresh"])  # (still idle by `later`: 120 s on)
    assert await store.reclaimer.run(later) == 0  # idle, and first seen unread: marked
    assert await store.reclaimer.run(later + 59) == 0  # unread for less than its idle time
    assert await store.reclaimer.run(later + 60) == 3
    assert sorted(forgotten) == ["t:consumed", "t:fresh", "t:idle"]
    # an offset is no reader (the protocol that owns the queue says who reads it); it goes too
    assert store.get_offset_now("group", "t:consumed") is None
    assert (await store.get("t:idle", 0, 10)).status is GetStatus.NO_SUCH_QUEUE
    assert store.max_offset_now("t:idle") == 0
    for kept in ("t:subscribed", "amqp-like"):
        assert [m.body for m in (await store.get(kept, 0, 10)).messages] == [f"{kept}-{i}".encode() for i in range(3)]

    # the name written again is a new queue: offsets from 0, none of the old messages
    result = await store.put(Message("x", b"again"), ["t:idle"])
    assert result.queue_offsets == {"t:idle": 0}
    assert [m.body for m in (await store.get("t:idle", 0, 10)).messages] == [b"again"]


async def test_a_queue_written_since_it_was_found_is_not_removed(open_store):
    store = await open_store()
    await store.put(Message("x", b"old"), ["t:a"])
    store.set_queue_policy(Policy())
    state = store.index.lookup("t:a")
    await store.put(Message("x", b"newer"), ["t:a"])
    assert store.reclaimer.remove_now([("t:a", state.qid, state.next_offset)]) == 0
    assert store.max_offset_now("t:a") == 2


async def test_a_queue_goes_only_once_unread_for_its_idle_time(open_store):
    store = await open_store()
    await store.put(Message("x", b"m"), ["t:a"])
    store.set_queue_policy(Policy(ttl_s=60.0))
    readers = {"t:a"}
    store.reclaimer.checks.append(lambda name: name in readers)
    t = time.time() + 3600  # long idle, but read
    assert await store.reclaimer.run(t) == 0
    readers.clear()  # the reader leaves: the clock starts at the next scan
    assert await store.reclaimer.run(t + 1) == 0
    assert await store.reclaimer.run(t + 60) == 0
    readers.add("t:a")  # back, and seen: the clock stops
    assert await store.reclaimer.run(t + 62) == 0
    readers.clear()
    assert await store.reclaimer.run(t + 63) == 0 and await store.reclaimer.run(t + 122) == 0
    assert await store.reclaimer.run(t + 123) == 1


async def test_clients_may_not_write_the_control_records_topic(open_store):
    store = await open_store()
    with pytest.raises(InvalidMessageError, match="reserved"):
        await store.put(Message(HOLD_TOPIC, b"Q\x00\x00\x00\x01" + bytes(8) + b"r:orders:0"), ["t:%HOLD%"])


async def test_no_policy_removes_nothing(open_store):
    store = await open_store()
    await store.put(Message("x", b"m"), ["t:a"])
    assert await store.reclaimer.run(time.time() + 10**9) == 0
    assert store.max_offset_now("t:a") == 1


CRASHER = textwrap.dedent("""
    import asyncio, os, sys, time
    from store import Message, MessageStore, StoreOptions
    sys.path.insert(0, sys.argv[2])
    from test_store_reclaim import Policy

    async def main():
        store = await MessageStore.open(StoreOptions(data_dir=sys.argv[1], flush="sync", index_flush_interval=3600.0))
        store.index.flush()  # the checkpoint before everything below: all of it is re-dispatched
        await store.put_batch([(Message("x", f"old{i}".encode()), ["t:a"]) for i in range(3)])
        await store.put(Message("x", b"other"), ["t:b"])
        store.save_offset_now("group", "t:a", 3)
        store.set_queue_policy(Policy(ttl_s=60.0))
        store.reclaimer.checks.append(lambda name: name == "t:b")
        assert await store.reclaimer.run(time.time() + 120) == 0
        assert await store.reclaimer.run(time.time() + 180) == 1
        assert store.get_offset_now("group", "t:a") is None  # the old queue's offset went with it
        await store.put_batch([(Message("x", f"new{i}".encode()), ["t:a"]) for i in range(2)])
        store.save_offset_now("group", "t:a", 1)  # the new queue's: re-dispatching the drop keeps it
        print("DONE", flush=True)
        os._exit(0)  # no close: the index memtable (WAL off) dies with the process

    asyncio.run(main())
""")


async def test_a_removal_and_the_queue_after_it_are_rebuilt_after_a_crash(open_store, data_dir):
    proc = subprocess.run([sys.executable, "-c", CRASHER, str(data_dir), str(ROOT / "tests")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr
    store = await open_store()
    assert store.recovery.records_redispatched >= 7
    # the new queue keeps the offsets it had before the crash, without the old messages
    assert [(m.queue_offset, m.body) for m in (await store.get("t:a", 0, 10)).messages] == [(0, b"new0"), (1, b"new1")]
    assert [m.body for m in (await store.get("t:b", 0, 10)).messages] == [b"other"]
    assert store.get_offset_now("group", "t:a") == 1


async def test_per_queue_rules_cut_by_age_and_by_size(open_store):
    store = await open_store()
    await store.put_batch([(Message("x", b"a" * 100), ["t:short"]) for _ in range(5)])
    await store.put_batch([(Message("x", b"b" * 100), ["t:small"]) for _ in range(10)])
    await store.put_batch([(Message("x", b"c" * 100), ["t:plain"]) for _ in range(5)])
    size = (await store.get("t:small", 0, 1)).messages[0].size
    # t:short keeps messages for ~0.36 s; t:small at most 3 messages' bytes; t:plain has no rule
    store.set_queue_policy(Policy(rules={"t:short": (0.0001, 0), "t:small": (0.0, 3 * size)}))
    time.sleep(0.5)
    await store.put(Message("x", b"fresh"), ["t:short"])
    await store.apply_retention()
    assert store.min_offset_now("t:short") == 5
    assert [m.body for m in (await store.get("t:short", 5, 10)).messages] == [b"fresh"]
    assert (await store.get("t:short", 0, 10)).status is GetStatus.OFFSET_TOO_SMALL
    assert store.min_offset_now("t:small") == 7 and len((await store.get("t:small", 7, 10)).messages) == 3
    assert len((await store.get("t:plain", 0, 10)).messages) == 5
    # a size rule counts what came since its last check too
    await store.put_batch([(Message("x", b"b" * 100), ["t:small"]) for _ in range(2)])
    await store.apply_retention()
    assert store.min_offset_now("t:small") == 9 and store.max_offset_now("t:small") == 12


async def test_a_longer_rule_keeps_segments_and_the_rest_follows_the_global_age(open_store):
    store = await open_store(retention_hours=0.0001)  # ~0.36 s
    await store.put(Message("x", b"kept"), ["t:long"])
    await store.put(Message("x", b"dropped"), ["t:other"])
    store.set_queue_policy(Policy(rules={"t:long": (1000.0, 0)}))
    assert store.retention.max_age_seconds == 1000.0 * 3600
    time.sleep(0.5)
    await store.put(Message("x", b"fresh"), ["t:other"])
    await store.apply_retention()
    assert [m.body for m in (await store.get("t:long", 0, 10)).messages] == [b"kept"]
    assert store.min_offset_now("t:other") == 1
    assert [m.body for m in (await store.get("t:other", 1, 10)).messages] == [b"fresh"]


async def test_a_size_rule_counts_released_held_messages_at_their_own_size(open_store):
    from store.holds.codec import TIMER

    store = await open_store()
    for i in range(8):
        await store.held.put(Message("x", bytes([i]) * 1000), ["t:timed"], TIMER, 1)
    await store.held.release(store.held.due(TIMER, 2, 100))
    (first,) = (await store.get("t:timed", 0, 1)).messages
    store.set_queue_policy(Policy(rules={"t:timed": (0.0, 3 * first.size)}))
    await store.apply_retention()
    assert store.min_offset_now("t:timed") == 5  # not the release records' few bytes each
    assert [m.body[0] for m in (await store.get("t:timed", 5, 10)).messages] == [5, 6, 7]
