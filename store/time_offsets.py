"""Offset-for-time lookups on a consume queue (Kafka's ``offsetsForTimes``): the first offset
whose store time is at or after a given time, by bisection over the queue's index entries.

Each entry keeps its message's store time (``consumequeue.ENTRY_VALUE``), and a queue's entries
are written in commitlog order by one dispatcher, so store times do not decrease along a queue
as long as the host's clock does not step back; like Kafka's time index, the lookup relies on
that. It reads O(log n) entries, so it is cheap enough for the event loop.
"""

from __future__ import annotations

from rocksdict import Rdict

from .consumequeue import ENTRY_VALUE, entry_key

_STORE_TS = 3  # the store time's field in ENTRY_VALUE (position, size, tag hash, store time)


def offset_for_time(db: Rdict, qid: int, low: int, high: int, timestamp_ms: int) -> int | None:
    """The first offset in [low, high) of queue ``qid`` whose store time is >= ``timestamp_ms``,
    or None when every one of them is earlier (Kafka answers null there too). An entry found
    missing (retention removed it after ``low`` was read) counts as earlier: it is gone."""
    lo, hi = low, high
    while lo < hi:
        mid = (lo + hi) // 2
        raw = db.get(entry_key(qid, mid))
        if raw is not None and ENTRY_VALUE.unpack(raw)[_STORE_TS] >= timestamp_ms:
            hi = mid
        else:
            lo = mid + 1
    return lo if lo < high else None
