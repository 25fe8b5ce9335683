"""The commitlog's read maps: readers tailing a writer see every byte written (flushed or not)
without re-mapping the active segment per read, reads across the map's edge and after a
truncation return exactly the bytes on disk, and the read-only reader of other processes
(``CommitLogReader``) follows the same rule."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

import pyarrow as pa  # (the arrow extra, which the test extra installs)

from store import Message, StoreWriteError
from store.read import columns
from store.log import commitlog as commitlog_module
from store.log.commitlog import CommitLog
from store.read.readonly import CommitLogReader

STEP = 64 << 10  # the map step the tests run with: small, so a few hundred KiB cross it often


@pytest.fixture
def maps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lengths of every ``mmap.mmap`` made while the test runs, with the map step set to STEP
    (set, not just changed: the code before the fix had no step at all)."""
    made: list[int] = []
    real = mmap.mmap

    def counting(fd: int, length: int, *args, **kwargs) -> mmap.mmap:
        made.append(length)
        return real(fd, length, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", counting)
    monkeypatch.setattr(commitlog_module, "MAP_STEP", STEP, raising=False)
    return made


def record(i: int, size: int = 1000) -> bytes:
    return (b"%08d" % i) * (size // 8)


def test_a_reader_tailing_the_writer_maps_once_per_step_not_per_read(tmp_path: Path, maps: list[int]) -> None:
    log = CommitLog(tmp_path, 1 << 30)
    written = 0
    for i in range(1000):  # ~1 MB in 1 KB appends, each read back at once, as a live consumer does
        data = record(i)
        [position] = log.append([data])
        written += len(data)
        assert log.read(position, len(data)) == data
    # read before any flush: what was written is readable at once
    assert log.flushed_position == 0
    assert 1 <= len(maps) <= written // STEP + 1, f"{len(maps)} maps for {written} bytes"
    log.close()


def test_reads_across_the_map_edge_and_past_the_end(tmp_path: Path, maps: list[int]) -> None:
    log = CommitLog(tmp_path, 1 << 30)
    first = bytes(range(256)) * (STEP // 256 + 3)  # more than a step: the first read maps it
    log.append([first])
    assert log.read(0, 10) == first[:10]
    assert len(maps) == 1 and maps[0] == len(first)
    second = b"x" * 5000  # the tail past the map is read without a new map
    log.append([second])
    whole = first + second
    edge = len(first)
    for at, size in [(edge - 100, 300), (edge, 100), (edge - 1, 1), (edge - 1, 2), (edge - 60000, STEP - 1),
                     (edge + 4000, 5000), (len(whole), 10), (len(whole) + 50, 10)]:
        assert log.read(at, size) == whole[at:at + size], (at, size)
    assert len(maps) == 1
    assert log.records([(edge - 8, 8), (edge, 8), (edge + 8, 16)]) == [whole[edge - 8:edge], second[:8], second[8:24]]
    assert log.read(0, len(whole)) == whole  # a read of a step or more maps rather than copies
    assert maps == [len(first), len(whole)]
    log.close()


def test_a_sealed_segment_is_mapped_whole_once(tmp_path: Path, maps: list[int]) -> None:
    log = CommitLog(tmp_path, 8192)
    positions = log.append([record(i, 4000) for i in range(6)])  # 3 segments of 2 records
    assert [p // 8192 for p in positions] == [0, 0, 1, 1, 2, 2]
    for _ in range(3):
        for i, p in enumerate(positions[:4]):
            assert log.read(p, 4000) == record(i, 4000)
    assert sorted(maps) == [8000, 8000]  # segments 0 and 1, once each; the active one is read by pread
    assert log.read(positions[5], 4000) == record(5, 4000)
    log.close()


def test_truncate_unmaps_and_later_reads_see_the_new_bytes(tmp_path: Path, maps: list[int]) -> None:
    log = CommitLog(tmp_path, 1 << 30)
    old = b"o" * (STEP * 2)
    log.append([old])
    assert log.read(STEP, 10) == old[STEP:STEP + 10]
    [seg] = log.segments()
    assert seg.view is not None
    log.truncate(STEP // 2)  # recovery / repair: the map goes before the file shrinks (SIGBUS)
    assert seg.view is None and os.fstat(seg.fd).st_size == STEP // 2
    assert log.read(STEP // 2 - 4, 100) == b"o" * 4
    assert log.read(STEP, 10) == b""
    new = b"n" * 3000
    assert log.append([new]) == [STEP // 2]
    assert log.read(STEP // 2 - 4, 100) == b"o" * 4 + b"n" * 96
    assert log.read(STEP // 2 + 2990, 100) == b"n" * 10
    log.close()


def test_a_failed_append_cuts_back_a_mapped_segment(tmp_path: Path, maps: list[int],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    log = CommitLog(tmp_path, 1 << 30)
    log.append([b"a" * (STEP + 10)])
    assert log.read(STEP, 10) == b"a" * 10
    real_pwrite = os.pwrite

    def disk_full_after_7_bytes(fd: int, data, offset: int) -> int:
        if len(data) > 7:
            return real_pwrite(fd, data[:7], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", disk_full_after_7_bytes)
    with pytest.raises(StoreWriteError, match="No space"):  # 7 bytes written, then cut back
        log.append([b"b" * 100])
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert log.read(STEP, 100) == b"a" * 10
    log.append([b"c" * 20])
    assert log.read(STEP, 100) == b"a" * 10 + b"c" * 20
    log.close()


async def test_store_consumers_tailing_live_puts_do_not_remap_per_get(open_store, maps: list[int]) -> None:
    store = await open_store()
    body = b"p" * 200
    written = 0
    for i in range(500):
        [result] = await store.put_batch([(Message(topic="t", body=body + b"%d" % i), ["t:q"])])
        written += result.size
        got = await store.get("t:q", i, 32)
        assert [m.body for m in got.messages] == [body + b"%d" % i]
    assert len(maps) <= written // STEP + 1, f"{len(maps)} maps for about {written} bytes"


async def test_bulk_reads_tailing_live_puts_map_once_per_step(open_store, maps: list[int]) -> None:
    """The read API's path (``read_range_live``: the read-only reader's own maps, from the
    store's index) over a queue read as it grows, one small range at a time."""
    store = await open_store()
    log = CommitLogReader(store.commitlog.directory)
    written = 0
    for i in range(300):
        [result] = await store.put_batch([(Message(topic="t", body=record(i)), ["t:q"])])
        written += result.size
        state = store.index.lookup("t:q")
        read = columns.read_range_live(store.index.db, log, store.commitlog, "t:q", state.qid, max(0, i - 1), i + 1)
        rows = pa.Table.from_batches(read.batches, columns.ARROW_SCHEMA)
        assert rows.column("offset").to_pylist() == list(range(max(0, i - 1), i + 1))
        assert rows.column("payload").to_pylist()[-1] == record(i)
    # the store's own reads map nothing here (no get); every map is the reader's
    assert 1 <= len(maps) <= written // STEP + 1, f"{len(maps)} maps for {written} bytes"
    whole = columns.read_range_live(store.index.db, log, store.commitlog, "t:q", state.qid, 0, 300)
    assert pa.Table.from_batches(whole.batches).column("payload").to_pylist() == [record(i) for i in range(300)]
    log.close()
