"""Store benchmark: put/get/recovery rates of the unified store, one printed line per case.

    python -m loadtest.bench_store [--quick] [--out FILE]

Every case runs in a fresh child process on a fresh temporary data dir, so ``rss_mb``
(resident memory at the end of the case) belongs to that case alone. Lines:

    store_put msg_bytes=64 queues=1000 flush=async writers=1 msgs_per_s=... loop_cpu_us=... rss_mb=...
    store_get queues=1000 msgs_per_s=...
    store_recover messages=1000000 seconds=... redispatched=...   (crash, then again with the index deleted)

``writers=1`` is one coroutine calling ``put_batch`` with 1,000 messages a call;
``writers=N>1`` is N coroutines each awaiting single ``put`` calls. Targets of each put
are drawn uniformly at random among the queues, before the clock starts. ``loop_cpu_us`` is
the CPU time of the event loop's thread per message over the same window (the store's and the
harness's work; RocksDB's flushes and compactions run on its own threads): it moves much less
than the rate when other jobs share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gateway.server import tune_gc
from store import GetStatus, Message, MessageStore, StoreOptions

from loadtest import runner

BATCH = 1000
GET_BATCH = 32


def rss_mb() -> int:
    return psutil.Process().memory_info().rss >> 20


async def put_case(data_dir: Path, msg_bytes: int, queues: int, flush: str, writers: int,
                   messages: int, seconds: float) -> str:
    names = [f"bench/q{i}" for i in range(queues)]
    rng = random.Random(42)
    picks = [names[rng.randrange(queues)] for _ in range(messages)]
    body = os.urandom(msg_bytes)
    # The store runs inside the gateway, whose process tunes Python's cyclic GC at start-up
    # (gateway.server.tune_gc: what exists then is frozen, young collections every 200,000
    # allocations); the bench does the same, which also keeps the harness's own lists (up to
    # 2M names) out of collections that would charge the store for walking them.
    tune_gc()
    store = await MessageStore.open(StoreOptions(data_dir=data_dir, flush=flush))  # type: ignore[arg-type]
    done = 0
    started = time.perf_counter()
    cpu_started = time.thread_time()
    deadline = started + seconds
    if writers == 1:
        while done < messages and time.perf_counter() < deadline:
            chunk = picks[done : done + BATCH]
            await store.put_batch([(Message("bench", body), [q]) for q in chunk])
            done += len(chunk)
    else:
        cursor = iter(range(messages))

        async def writer() -> None:
            nonlocal done
            for i in cursor:
                await store.put(Message("bench", body), [picks[i]])
                done += 1
                if done % 256 == 0 and time.perf_counter() > deadline:
                    return

        await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - started
    loop_cpu = time.thread_time() - cpu_started
    rss = rss_mb()
    await store.close()
    return (
        f"store_put msg_bytes={msg_bytes} queues={queues} flush={flush} writers={writers} "
        f"msgs_per_s={int(done / elapsed)} loop_cpu_us={loop_cpu / done * 1e6:.2f} rss_mb={rss}"
    )


async def get_case(data_dir: Path, queues: int, messages: int) -> str:
    names = [f"bench/q{i}" for i in range(queues)]
    rng = random.Random(7)
    store = await MessageStore.open(StoreOptions(data_dir=data_dir))
    body = os.urandom(64)
    for _ in range(0, messages, BATCH):
        await store.put_batch([(Message("bench", body), [names[rng.randrange(queues)]]) for _ in range(BATCH)])
    read = 0
    started = time.perf_counter()
    for name in names:
        offset = 0
        while True:
            res = await store.get(name, offset, GET_BATCH)
            if res.status is not GetStatus.FOUND:
                break
            read += len(res.messages)
            offset = res.next_offset
    elapsed = time.perf_counter() - started
    await store.close()
    if read != messages:
        raise SystemExit(f"store_get read {read} messages, expected {messages}")
    return f"store_get queues={queues} msgs_per_s={int(read / elapsed)}"


async def crash_writer(data_dir: Path, messages: int) -> None:
    """Write and die without closing: the index memtable (WAL off) is lost, recovery rebuilds it."""
    store = await MessageStore.open(StoreOptions(data_dir=data_dir, index_flush_interval=3600.0))
    body = os.urandom(64)
    for start in range(0, messages, BATCH):
        await store.put_batch([(Message("bench", body), [f"bench/q{(start + i) % 1000}"]) for i in range(BATCH)])
    store.commitlog.flush()
    os._exit(0)


async def recover_case(data_dir: Path, messages: int) -> str:
    started = time.perf_counter()
    store = await MessageStore.open(StoreOptions(data_dir=data_dir))
    total = sum([await store.max_offset(f"bench/q{i}") for i in range(1000)])
    redispatched = store.recovery.records_redispatched if store.recovery else 0
    await store.close()
    elapsed = time.perf_counter() - started
    if total != messages:
        raise SystemExit(f"store_recover found {total} messages, expected {messages}")
    return f"store_recover messages={messages} seconds={elapsed:.2f} redispatched={redispatched}"


def run_child(case: list[str]) -> str:
    """Run one case in a fresh interpreter (its own RSS) and return its printed line."""
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.bench_store", "--case", *case],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
    )
    if result.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{result.stderr}")
    return result.stdout.strip().splitlines()[-1]


def plan(quick: bool) -> list[list[str]]:
    cases: list[list[str]] = []
    sizes = [64] if quick else [64, 1024]
    queue_counts = [1, 1000] if quick else [1, 1000, 100_000, 1_000_000]
    seconds = 2.0 if quick else 5.0
    for size in sizes:
        for queues in queue_counts:
            # at a million queues, write a million messages so the queue table really grows
            count = 1_000_000 if queues == 1_000_000 else 2_000_000
            limit = 600.0 if queues == 1_000_000 else seconds
            for flush, writers in (("async", 1), ("async", 64), ("sync", 32)):
                cases.append(["put", str(size), str(queues), flush, str(writers), str(count), str(limit)])
    for queues in (1, 1000):
        cases.append(["get", str(queues), str(100_000 if quick else 300_000)])
    cases.append(["recover", str(100_000 if quick else 1_000_000), "crash"])
    cases.append(["recover", str(100_000 if quick else 1_000_000), "index-lost"])
    return cases


def run_case(case: list[str]) -> None:
    kind, *args = case
    if kind == "crash-writer":
        asyncio.run(crash_writer(Path(args[0]), int(args[1])))
        return
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-bench-"))
    try:
        if kind == "put":
            size, queues, flush, writers, count, limit = args
            line = asyncio.run(put_case(tmp / "data", int(size), int(queues), flush, int(writers),
                                        int(count), float(limit)))
        elif kind == "get":
            line = asyncio.run(get_case(tmp / "data", int(args[0]), int(args[1])))
        elif kind == "recover":
            messages, how = int(args[0]), args[1]
            data = tmp / "data"
            writer = subprocess.run(
                [sys.executable, "-m", "loadtest.bench_store", "--case", "crash-writer", str(data), str(messages)],
                capture_output=True, text=True,
            )
            if writer.returncode != 0:
                raise SystemExit(f"crash writer failed:\n{writer.stderr}")
            if how == "index-lost":  # the whole index is rebuilt from the commitlog
                shutil.rmtree(data / "index")
            line = asyncio.run(recover_case(data, messages))
        else:
            raise SystemExit(f"unknown case {kind}")
        print(line, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = runner.parser(__doc__, quick="a reduced set that runs in under a minute")
    parser.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        run_case(args.case)
        return
    started = time.perf_counter()
    with runner.Lines(args.out) as out:
        for case in plan(args.quick):
            out.emit(run_child(case))
    print(f"# {len(plan(args.quick))} cases in {time.perf_counter() - started:.0f} s on {os.cpu_count()} cores",
          flush=True)


if __name__ == "__main__":
    main()
