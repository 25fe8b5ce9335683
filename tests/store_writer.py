"""A store writer run as a separate process by the crash tests.

Prints one JSON line per acknowledged put (after the store acknowledged it), so whatever
the parent has read when it SIGKILLs this process was acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from store import Message, MessageStore, StoreOptions


async def run(args: argparse.Namespace) -> None:
    store = await MessageStore.open(
        StoreOptions(
            data_dir=args.data_dir,
            flush=args.flush,
            segment_size=args.segment_size,
            index_flush_interval=3600.0,
        )
    )
    out = sys.stdout
    count = 0

    async def writer(w: int) -> None:
        nonlocal count
        i = 0
        while count < args.messages:
            count += 1
            body = f"w{w}-{i}".encode()
            queues = [f"crash/{(w + i) % args.queues}"]
            if i % 5 == 0:
                queues.append("crash/all")
            res = await store.put(Message("crash", body * 8), queues)
            out.write(json.dumps({"id": res.msg_id, "body": body.decode(), "offsets": res.queue_offsets}) + "\n")
            out.flush()
            i += 1

    await asyncio.gather(*(writer(w) for w in range(args.writers)))
    out.write("DONE\n")
    out.flush()
    if args.exit_hard:
        os._exit(0)  # no close: the index memtable (WAL off) is lost
    await store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("--flush", default="sync")
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=7)
    parser.add_argument("--segment-size", type=int, default=1 << 20)
    parser.add_argument("--exit-hard", action="store_true")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
