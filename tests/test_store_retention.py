"""Retention: whole segments go by size or age; reads below the new minimum say so."""

from __future__ import annotations

import os
import time

from store import GetStatus, Message


async def fill(store, n=60):
    return await store.put_batch(
        [(Message("t", f"{i:03d}".encode() * 230), ["q", f"q{i % 2}"]) for i in range(n)]
    )


async def test_retention_by_size_deletes_oldest_segments_and_index_entries(open_store, data_dir):
    store = await open_store(segment_size=8192, retention_bytes=20_000, retention_hours=0)
    results = await fill(store)
    assert await store.apply_retention() > 0
    segments = sorted(p for p in (data_dir / "commitlog").iterdir() if p.name.isdigit())
    assert sum(p.stat().st_size for p in segments) <= 20_000
    assert store.min_position == int(segments[0].name) > 0

    first_kept = next(i for i, r in enumerate(results) if r.position >= store.min_position)
    assert await store.min_offset("q") == first_kept
    below = await store.get("q", 0, 10)
    assert below.status is GetStatus.OFFSET_TOO_SMALL
    assert below.next_offset == below.min_offset == first_kept and below.messages == []
    got = await store.get("q", first_kept, 100)
    assert [m.msg_id for m in got.messages] == [r.msg_id for r in results[first_kept:]]
    assert await store.get_by_id(results[0].msg_id) is None
    assert await store.get_by_id(results[first_kept].msg_id) is not None
    # the index itself no longer holds entries below the minimum (range-deleted)
    state = store.index.lookup("q")
    assert store.index.first_offset(state.qid) == first_kept
    assert store.index.entry(state.qid, 0) is None
    # offsets keep counting after retention, and a restart keeps the new minimum
    res = await store.put(Message("t", b"new"), ["q"])
    assert res.queue_offsets == {"q": 60}
    await store.close()
    store = await open_store(segment_size=8192, retention_bytes=20_000, retention_hours=0)
    assert await store.min_offset("q") == first_kept and await store.max_offset("q") == 61


async def test_retention_by_age_keeps_the_active_segment(open_store, data_dir):
    store = await open_store(segment_size=8192, retention_hours=1.0)
    results = await fill(store)
    assert await store.apply_retention() == 0  # nothing is an hour old yet
    old = time.time() - 2 * 3600
    for p in (data_dir / "commitlog").iterdir():
        if p.name.isdigit():
            os.utime(p, (old, old))
    deleted = await store.apply_retention()
    segments = [p for p in (data_dir / "commitlog").iterdir() if p.name.isdigit()]
    assert deleted > 0 and len(segments) == 1  # the active segment always stays
    active_start = int(segments[0].name)
    kept = [r for r in results if r.position >= active_start]
    got = await store.get("q", await store.min_offset("q"), 100)
    assert [m.msg_id for m in got.messages] == [r.msg_id for r in kept]
    assert (await store.get("q0", 0)).status is GetStatus.OFFSET_TOO_SMALL


async def test_a_queue_emptied_by_retention_keeps_counting_after_a_restart(open_store):
    options = dict(segment_size=8192, retention_bytes=20_000, retention_hours=0, queue_cache_entries=16)
    store = await open_store(**options)
    await store.put_batch([(Message("t", b"o" * 500), ["old"]) for _ in range(30)])
    await fill(store, 60)
    assert await store.apply_retention() > 0
    assert await store.min_offset("old") == await store.max_offset("old") == 30  # every entry gone
    await store.close()
    store = await open_store(**options)  # its state comes from the index again, not memory
    assert await store.max_offset("old") == 30
    below = await store.get("old", 0, 10)
    assert below.status is GetStatus.OFFSET_TOO_SMALL and below.next_offset == 30
    res = await store.put(Message("t", b"again"), ["old"])
    assert res.queue_offsets == {"old": 30}
    got = await store.get("old", 30, 10)
    assert [m.body for m in got.messages] == [b"again"]
    await store.close()
    # the head retention wrote says 30; the entry written after it, 31
    store = await open_store(**options)
    assert await store.max_offset("old") == 31
    assert (await store.put(Message("t", b"more"), ["old"])).queue_offsets == {"old": 31}
