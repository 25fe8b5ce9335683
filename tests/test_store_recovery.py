"""Crash, torn-write, corruption and disk-full behaviour of the store, through real processes and files."""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store import GetStatus, Message, StoreCorruptError, StoreWriteError

ROOT = Path(__file__).resolve().parent.parent


def start_writer(data_dir: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.store_writer", str(data_dir), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def read_queue(store, queue: str):
    out, offset = [], 0
    while True:
        res = await store.get(queue, offset, 256)
        if res.status is not GetStatus.FOUND:
            return out
        out.extend(res.messages)
        offset = res.next_offset


@pytest.mark.slow
async def test_sigkill_mid_load_loses_no_acknowledged_put(open_store, data_dir):
    proc = start_writer(data_dir, "--flush", "sync", "--writers", "32", "--segment-size", str(256 << 10))
    acked = []
    deadline = time.monotonic() + 60
    try:
        while len(acked) < 3000 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"writer died early: {proc.stderr.read()}"
            acked.append(json.loads(line))
    finally:
        proc.send_signal(signal.SIGKILL)
    # lines already in the pipe were printed after their put was acknowledged: they count too
    rest, _ = proc.communicate(timeout=30)
    acked.extend(json.loads(line) for line in rest.splitlines() if line.startswith("{"))
    assert proc.returncode == -signal.SIGKILL
    assert len(acked) >= 3000

    store = await open_store()
    assert store.recovery.records_redispatched > 0  # the index memtable died with the writer
    seen = collections.Counter()
    queues = {q for a in acked for q in a["offsets"]}
    for queue in queues:
        for m in await read_queue(store, queue):
            seen[(queue, m.body)] += 1
    for a in acked:
        body = a["body"].encode() * 8
        for queue, offset in a["offsets"].items():
            assert seen[(queue, body)] == 1, f"{a} present {seen[(queue, body)]} times in {queue}"
            got = await store.get(queue, offset, 1)
            assert got.messages and got.messages[0].body == body, f"offset changed for {a}"
            assert got.messages[0].msg_id == a["id"]
    assert max(seen.values()) == 1, "no message may be stored twice"


async def test_index_rebuilt_after_process_exit_without_close(open_store, data_dir):
    proc = start_writer(
        data_dir, "--flush", "async", "--writers", "8", "--messages", "4000", "--queues", "50", "--exit-hard"
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    acked = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(acked) == 4000
    store = await open_store()
    assert store.recovery.records_redispatched == 4000
    for a in acked[::37]:
        for queue, offset in a["offsets"].items():
            got = await store.get(queue, offset, 1)
            assert got.messages[0].msg_id == a["id"]
    assert sum([await store.max_offset(f"crash/{q}") for q in range(50)]) == 4000


async def test_torn_tail_is_truncated(open_store, data_dir):
    store = await open_store()
    results = await store.put_batch([(Message("t", f"m{i}".encode()), ["q"]) for i in range(20)])
    await store.close()
    segment = data_dir / "commitlog" / f"{0:020d}"
    valid = segment.stat().st_size
    record = segment.read_bytes()[results[3].position : results[3].position + results[3].size]
    with segment.open("ab") as fh:  # a write cut short: half of one more record
        fh.write(record[: len(record) // 2])

    store = await open_store()
    assert store.recovery.torn_bytes_dropped == len(record) // 2
    assert segment.stat().st_size == valid
    assert [m.body for m in await read_queue(store, "q")] == [f"m{i}".encode() for i in range(20)]
    res = await store.put(Message("t", b"next"), ["q"])
    assert res.queue_offsets == {"q": 20} and res.position == valid


async def test_mid_segment_corruption_is_refused_then_repaired(open_store, data_dir):
    store = await open_store()
    results = await store.put_batch([(Message("t", f"message-{i:03d}".encode()), ["q", "all"]) for i in range(100)])
    await store.close()
    segment = data_dir / "commitlog" / f"{0:020d}"
    damaged = results[50]
    with segment.open("r+b") as fh:  # flip one byte of message 50's body
        fh.seek(damaged.position + damaged.size - 2)
        byte = fh.read(1)
        fh.seek(damaged.position + damaged.size - 2)
        fh.write(bytes([byte[0] ^ 0xFF]))

    with pytest.raises(StoreCorruptError) as info:
        await open_store()
    assert info.value.path == str(segment) and info.value.position == damaged.position
    assert "--repair" in str(info.value)

    store = await open_store(repair=True)
    end = results[-1].position + results[-1].size
    assert store.recovery.repaired_bytes_dropped == end - damaged.position
    assert store.recovery.index_entries_removed == 100  # 50 in each of the two queues
    for queue in ("q", "all"):
        assert await store.max_offset(queue) == 50
        assert [m.body for m in await read_queue(store, queue)] == [f"message-{i:03d}".encode() for i in range(50)]
    res = await store.put(Message("t", b"after-repair"), ["q"])
    assert res.queue_offsets == {"q": 50} and res.position == damaged.position
    await store.close()
    store = await open_store()  # and the repaired store opens cleanly again
    assert await store.max_offset("q") == 51


@pytest.fixture
def tiny_commitlog_fs(data_dir):
    """The commitlog directory on a 256 KiB tmpfs, so writes hit ENOSPC for real."""
    mountpoint = data_dir / "commitlog"
    mountpoint.mkdir(parents=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tidemq-test", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.fail(f"this test mounts a tmpfs and needs root: {result.stderr.strip()}")
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], check=False)


async def test_full_disk_fails_the_put_and_loses_nothing_acknowledged(open_store, data_dir, tiny_commitlog_fs):
    store = await open_store(segment_size=1 << 20)
    acked = []
    error = None
    for i in range(200):
        try:
            res = await store.put(Message("t", f"{i:04d}".encode() * 1000), ["q"])
        except StoreWriteError as exc:
            error = exc
            break
        acked.append(res)
    assert error is not None and "No space left" in str(error)
    assert 10 < len(acked) < 200
    # the failed put left nothing behind and reads still work
    assert store.end_position == acked[-1].position + acked[-1].size
    got = await store.get("q", 0, 1000)
    assert [m.msg_id for m in got.messages] == [r.msg_id for r in acked]
    # a batch that does not fit fails whole, a small put that fits still succeeds
    with pytest.raises(StoreWriteError):
        await store.put_batch([(Message("t", b"z" * 4000), ["q"]) for _ in range(20)])
    small = await store.put(Message("t", b"small"), ["q"])
    assert small.queue_offsets == {"q": len(acked)}
    await store.close()

    store = await open_store(segment_size=1 << 20)
    assert store.recovery.torn_bytes_dropped == 0
    got = await store.get("q", 0, 1000)
    assert [m.msg_id for m in got.messages] == [r.msg_id for r in acked] + [small.msg_id]


async def test_index_ahead_of_a_shorter_commitlog_is_cut_back(open_store, data_dir):
    """An OS crash in async mode can lose commitlog pages the index already points at."""
    store = await open_store(flush="async")
    results = await store.put_batch([(Message("t", f"m{i}".encode()), ["q", f"q{i % 3}"]) for i in range(30)])
    await store.close()  # the index (and its checkpoint) now cover all 30 records
    segment = data_dir / "commitlog" / f"{0:020d}"
    with segment.open("r+b") as fh:  # the last 10 records never reached the disk
        fh.truncate(results[20].position)

    store = await open_store(flush="async")
    assert store.recovery.index_entries_removed == 20  # 10 in "q", 10 across q0..q2
    assert await store.max_offset("q") == 20
    assert sum([await store.max_offset(f"q{i}") for i in range(3)]) == 20
    res = await store.put(Message("t", b"again"), ["q"])
    assert res.queue_offsets == {"q": 20} and res.position == results[20].position
    got = await store.get("q", 19, 5)
    assert [m.body for m in got.messages] == [b"m19", b"again"]


async def test_a_full_disk_is_logged_once_per_interval_without_tracebacks(open_store, tiny_commitlog_fs, caplog):
    """Every put on a full disk fails; the log says so once (with a count later), not once per
    failed commit with a traceback (thousands of lines, written onto the full disk)."""
    store = await open_store(segment_size=1 << 20)
    caplog.set_level(logging.INFO, logger="tidemq.store")
    failed = 0
    for i in range(300):
        try:
            await store.put(Message("t", b"x" * 4000), ["q"])
        except StoreWriteError:
            failed += 1
    assert failed > 200
    lines = [r for r in caplog.records if r.name == "tidemq.store" and "commit failed" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.ERROR and lines[0].exc_info is None
    assert "No space left" in lines[0].getMessage() and "count=1" in lines[0].getMessage()
    await store.close()  # closing writes the count of what the interval held back
    lines = [r.getMessage() for r in caplog.records if r.name == "tidemq.store" and "commit failed" in r.getMessage()]
    assert len(lines) == 2 and f"count={failed - 1}" in lines[1], lines
