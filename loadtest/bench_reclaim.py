"""What the store's idle-queue scan (store/retention/reclaim.py) costs the event loop, at many queues.

    python -m loadtest.bench_reclaim [--queues 200000] [--data-dir DIR]

A store in a temporary directory gets ``--queues`` light queues (``t:dev/{i}/t``, one 16 B
message each, in batches of 10,000) and is opened again (as after a restart, the scan reads
rows from RocksDB), then one scan runs with an idle time that
nothing has reached (every queue is examined, none goes) while a task measures the longest the
event loop went without running it. Then a second scan with every queue idle and unread marks
them, and a third, an idle time later, removes them. Prints one line per scan:

    reclaim scan=check queues=200000 seconds=... us_per_queue=... max_loop_stall_ms=... removed=0
"""

from __future__ import annotations

import asyncio
import tempfile
import time

from store import Message, MessageStore, StoreOptions

from loadtest import runner

BATCH = 10_000


class Policy:
    has_rules = False
    longest_hours = 0.0
    light_prefixes = ("t:",)

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s

    def idle_ttl_s(self, queue: str) -> float:
        return self.ttl_s

    def retention(self, queue: str) -> tuple[float, int] | None:
        return None


async def timed_scan(store: MessageStore, name: str, queues: int, now: float) -> None:
    stalls: list[float] = []
    done = False

    async def watch() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            at = time.perf_counter()
            stalls.append(at - last)
            last = at

    watcher = asyncio.create_task(watch())
    started = time.perf_counter()
    removed = await store.reclaimer.run(now)
    seconds = time.perf_counter() - started
    done = True
    await watcher
    print(f"reclaim scan={name} queues={queues} seconds={seconds:.2f} us_per_queue={seconds / queues * 1e6:.1f} "
          f"max_loop_stall_ms={max(stalls) * 1000:.1f} removed={removed}", flush=True)


async def main(queues: int, data_dir: str | None) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-reclaim-", dir=data_dir) as workdir:
        store = await MessageStore.open(StoreOptions(data_dir=workdir))
        for first in range(0, queues, BATCH):
            await store.put_batch([(Message("dev", b"x" * 16), [f"t:dev/{i}/t"])
                                   for i in range(first, min(queues, first + BATCH))])
        await store.close()
        store = await MessageStore.open(StoreOptions(data_dir=workdir))  # (as after a restart: nothing cached)
        try:
            now = time.time()
            store.set_queue_policy(Policy(ttl_s=3600.0))
            await timed_scan(store, "check", queues, now)  # nothing is idle for an hour yet
            await timed_scan(store, "mark", queues, now + 3600)
            await timed_scan(store, "remove", queues, now + 7200)
        finally:
            await store.close()


if __name__ == "__main__":
    parser = runner.parser(__doc__, out=False)
    parser.add_argument("--queues", type=int, default=200_000)
    parser.add_argument("--data-dir", help="where the temporary store goes (default: the system's temp dir)")
    args = parser.parse_args()
    asyncio.run(main(args.queues, args.data_dir))
