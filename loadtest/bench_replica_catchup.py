"""Replica catch-up benchmark: how fast a follower that starts from an empty log copies and
indexes its leader's, over the replication link on loopback.

    python -m loadtest.bench_replica_catchup [--quick] [--mb N] [--leader-load] [--follower-process]
                                             [--out FILE]

Two real stores (store/replica/): the leader is filled with ``--mb`` megabytes of 1,000-byte
messages over 100 queues, then a follower starts from nothing and streams until its log and
index reach the leader's end at its start. With ``--leader-load`` the leader keeps taking puts
(batches of 100) while the follower catches up. Both in one process by default (one
interpreter for the leader, its load and the follower); ``--follower-process``: the follower in
a process of its own, as a replica runs (timed from its ``follow`` on, its start-up not counted).
One line:

    replica catchup_mb=... seconds=... mb_per_s=... leader_load=on|off follower=same_process|own_process
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path

from store import InSyncSet, Message, MessageStore, ReplicaNode, ReplicaSettings, StoreOptions

from loadtest import runner

BODY = 1000
QUEUES = 100
SEGMENT = 64 << 20


async def measure(size_mb: int, leader_load: bool, follower_process: bool) -> tuple[float, float]:
    """(megabytes copied, seconds) for a follower from empty to the leader's end at its start."""
    root = Path(tempfile.mkdtemp(prefix="tidemq-catchup-"))
    try:
        leader = await MessageStore.open(StoreOptions(data_dir=root / "leader", segment_size=SEGMENT))
        in_sync = InSyncSet()
        leading = ReplicaNode(leader, ReplicaSettings("leader", mode="async", min_insync=1), in_sync)
        port = await leading.lead(1, "127.0.0.1", 0)
        body = os.urandom(BODY)
        while leader.commitlog.end_position < size_mb * 1_000_000:
            await leader.put_batch([(Message("t", body), [f"q{j % QUEUES}"]) for j in range(1000)])
        stop = asyncio.Event()

        async def load() -> None:
            i = 0
            while not stop.is_set():
                await leader.put_batch([(Message("t", body), [f"q{(i + j) % QUEUES}"]) for j in range(100)])
                i += 100
                await asyncio.sleep(0)

        loader = asyncio.get_running_loop().create_task(load()) if leader_load else None
        target = leader.commitlog.end_position  # (with load: the end when the follower starts)
        if follower_process:
            context = multiprocessing.get_context("spawn")
            results = context.Queue()
            child = context.Process(target=_follower_process, args=(root / "follower", port, target, results))
            child.start()
            seconds = await asyncio.to_thread(results.get, True, 600)
            await asyncio.to_thread(child.join, 60)
        else:
            seconds = await _follow(root / "follower", port, target, in_sync)
        stop.set()
        if loader is not None:
            await loader
        await leading.stop()
        await leader.close()
        return target / 1e6, seconds
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _follow(path: Path, port: int, target: int, in_sync: InSyncSet) -> float:
    """Seconds from a new follower's ``follow`` until its log and index reach ``target``."""
    follower = await MessageStore.open(StoreOptions(data_dir=path, segment_size=SEGMENT))
    following = ReplicaNode(follower, ReplicaSettings("follower", mode="async", min_insync=1), in_sync)
    started = time.monotonic()
    await following.follow(lambda: ("127.0.0.1", port))
    while follower.commitlog.end_position < target or follower.index.dispatched_position < target:
        await asyncio.sleep(0.005)
    seconds = time.monotonic() - started
    await following.stop()
    await follower.close()
    return seconds


def _follower_process(path: Path, port: int, target: int, results: "multiprocessing.Queue[float]") -> None:
    results.put(asyncio.run(_follow(path, port, target, InSyncSet())))


def main() -> None:
    parser = runner.parser(__doc__, quick="64 MB")
    parser.add_argument("--mb", type=int, default=256, help="megabytes in the leader's log (default 256)")
    parser.add_argument("--leader-load", action="store_true", help="the leader takes puts meanwhile")
    parser.add_argument("--follower-process", action="store_true", help="the follower in a process of its own")
    args = parser.parse_args()
    size = 64 if args.quick else args.mb
    copied, seconds = asyncio.run(measure(size, args.leader_load, args.follower_process))
    with runner.Lines(args.out) as out:
        out.emit(f"replica catchup_mb={copied:.0f} seconds={seconds:.2f} mb_per_s={copied / seconds:.0f} "
                 f"leader_load={'on' if args.leader_load else 'off'} "
                 f"follower={'own_process' if args.follower_process else 'same_process'}")


if __name__ == "__main__":
    main()
