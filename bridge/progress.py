"""What an operator sees of a running tidemq stream, within what PySpark 4.3 lets a Python source
report.

PySpark 4.3's Python streaming API has no hook for the source's description (a query's progress
names the JVM wrapper, ``PythonMicroBatchStreamWithTriggerAvailableNow@...``) nor for custom
source metrics (the JVM wrapper does not implement ``ReportsSourceMetrics``; the Kafka source's
``minOffsetsBehindLatest`` & co. come from there). What it does carry: ``startOffset``,
``endOffset`` and ``latestOffset`` per source, keyed by queue name (the source answers
``reportLatestOffset`` with every queue's latest offset). ``offsets_behind`` turns one source's
progress into the Kafka source's metrics and per-queue lag, for a listener or a dashboard.

``EmptyWatch``: a WARN, once per query, while none of its queues holds a message yet (a filter
nobody publishes to, a misspelt queue), so that a silent query says why it is silent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("tidemq.spark")


def offsets_behind(source: Mapping[str, Any]) -> dict[str, Any]:
    """From one entry of ``query.lastProgress["sources"]``: the offsets the query is behind the
    queues' latest after this trigger, in all (``total``), per queue (``queues``) and as Kafka's
    ``min/max/avgOffsetsBehindLatest``. Empty when the progress has no offsets yet."""

    def offsets(key: str) -> dict[str, int]:
        value = source.get(key)
        if isinstance(value, str):
            value = json.loads(value)
        return dict(value or {})

    end, latest = offsets("endOffset"), offsets("latestOffset")
    behind = {q: max(0, high - end.get(q, 0)) for q, high in latest.items()}
    if not behind:
        return {}
    return {"total": sum(behind.values()), "queues": behind, "minOffsetsBehindLatest": min(behind.values()),
            "maxOffsetsBehindLatest": max(behind.values()),
            "avgOffsetsBehindLatest": sum(behind.values()) / len(behind)}


class EmptyWatch:
    def __init__(self, what: str) -> None:
        self.what = what  # "topicFilter 'a/+'" or "queues 't:a'"
        self._warned = False

    def check(self, offsets: Mapping[str, tuple[int, int]]) -> None:
        """``offsets``: (first readable, next) per queue of the query, (0, 0) for one not in the store."""
        if self._warned or any(high > 0 for _, high in offsets.values()):
            return
        self._warned = True
        log.warning("tidemq source: %s matches no stored message yet; the query waits for the first one "
                    "(queues=%s)", self.what, ",".join(sorted(offsets)) or "-")
