"""``python -m gateway`` with Python's allocations traced (tracemalloc): each SIGUSR1 writes a
snapshot to ``$TRACED_GATEWAY_SNAPSHOTS/snapshot-N.pickle``, so a load test can say which lines
of ours hold the memory a run grows by (native memory, such as RocksDB's, is not traced).

    python -m loadtest.traced_gateway serve --data-dir ...   (as python -m gateway)
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 4  # frames kept per allocation: enough to see whose call made it


def main() -> None:
    folder = Path(os.environ["TRACED_GATEWAY_SNAPSHOTS"])
    numbers = itertools.count()

    def snapshot(signum: int, frame: FrameType | None) -> None:
        path = folder / f"snapshot-{next(numbers)}.pickle"
        tracemalloc.take_snapshot().dump(f"{path}.part")
        os.replace(f"{path}.part", path)  # (whole when it appears)

    tracemalloc.start(FRAMES)
    signal.signal(signal.SIGUSR1, snapshot)
    from gateway.cli import main as gateway_main

    sys.argv[0] = "gateway"
    raise SystemExit(gateway_main())


if __name__ == "__main__":
    main()
