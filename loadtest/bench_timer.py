"""Timer benchmark: schedule many timer messages, hold them, release a slice on time.

    python -m loadtest.bench_timer [--quick] [--messages N] [--spread-s S] [--out FILE]

In one process, as the gateway runs them: the store (``--flush async``) and the gateway's one
timer service (gateway/core/timer.py). 1,000,000 timer messages (64-byte bodies, 100 queues)
are scheduled with due times spread uniformly over the next 10 minutes, 1,000 per group
commit, as fast as the store takes them; then the run goes on for ``--slice-s`` seconds with
no other load, while the timer releases what comes due. Lines:

    timer scheduled=1000000 schedule_msgs_per_s=... rss_mb=... pending=...
    timer due_lag_ms p50=... p99=... max=... released=... slice_s=...

Each released message's lag is its queue entry's store time (the release's commit) minus the
due time its body carries, for the messages due after scheduling ended and before the slice's
end (those due while scheduling ran are released under that load and counted apart, as
``released_during_schedule``).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gateway.core.timer import TimerService
from gateway.server import tune_gc
from store import GetStatus, Message, MessageStore, StoreOptions
from store.holds.codec import TIMER

from loadtest import runner

BATCH = 1000
QUEUES = 100
BODY_PAD = b"x" * 44  # with the 20-digit due time: 64-byte bodies


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def percentile(values: list[int], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))])


async def run(data_dir: Path, messages: int, spread_s: float, slice_s: float) -> list[str]:
    tune_gc()
    store = await MessageStore.open(StoreOptions(data_dir=data_dir, flush="async"))
    timer = TimerService(store)
    timer.start()
    rng = random.Random(7)
    names = [f"bench/timer/{i}" for i in range(QUEUES)]
    start = now_ms()
    try:
        began = time.perf_counter()
        for at in range(0, messages, BATCH):
            n = min(BATCH, messages - at)
            dues = [start + int(rng.random() * spread_s * 1000) for _ in range(n)]
            items = [(Message("bench/timer", b"%020d" % due + BODY_PAD), [names[rng.randrange(QUEUES)]])
                     for due in dues]
            await store.held.put_batch(items, TIMER, dues)
            timer.scheduled(min(dues))
        took = time.perf_counter() - began
        scheduled_end = now_ms()
        rss = psutil.Process().memory_info().rss >> 20
        pending = timer.pending
        lines = [f"timer scheduled={messages} schedule_msgs_per_s={messages / took:.0f} rss_mb={rss} "
                 f"pending={pending} schedule_s={took:.1f}"]
        await asyncio.sleep(slice_s)
        slice_end = now_ms() - 1000  # (what came due in the last second may still be on its way)
        lags, during = [], 0
        for name in names:
            offset = 0
            while True:
                got = await store.get(name, offset, 1024, 64 << 20)
                if got.status is not GetStatus.FOUND:
                    break
                for message in got.messages:
                    due = int(message.body[:20])
                    entry = store.index.entry(store.index.lookup(name).qid, message.queue_offset)
                    if due < scheduled_end:
                        during += 1
                    elif due <= slice_end:
                        lags.append(entry[3] - due)
                offset = got.next_offset
        lines.append(f"timer due_lag_ms p50={percentile(lags, 50):.0f} p99={percentile(lags, 99):.0f} "
                     f"max={max(lags, default=0)} released={len(lags)} released_during_schedule={during} "
                     f"slice_s={(slice_end - scheduled_end) / 1000:.1f}")
        return lines
    finally:
        await timer.stop()
        await store.close()


def main() -> None:
    parser = runner.parser(__doc__, quick="100,000 messages over 60 s, a 10 s slice")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--spread-s", type=float, default=600.0)
    parser.add_argument("--slice-s", type=float, default=30.0)
    args = parser.parse_args()
    if args.quick:
        args.messages, args.spread_s, args.slice_s = 100_000, 60.0, 10.0
    data_dir = Path(tempfile.mkdtemp(prefix="tidemq-bench-timer-"))
    try:
        lines = asyncio.run(run(data_dir, args.messages, args.spread_s, args.slice_s))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    head = f"# bench_timer cores={psutil.cpu_count()} python={sys.version.split()[0]}" + (" quick=1" if args.quick else "")
    with runner.Lines(args.out) as out:
        for line in [head, *lines]:
            out.emit(line)


if __name__ == "__main__":
    main()
