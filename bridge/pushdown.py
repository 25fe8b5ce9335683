"""Filter pushdown for batch reads of the ``tidemq`` source (``DataSourceReader.pushFilters``).

Spark hands the reader the query's ANDed predicates that it can express
(``pyspark.sql.datasource.Filter``); what the store can use narrows the plan before a row is
read, and every filter not fully honoured goes back to Spark, which applies it to the rows as
usual (never dropped silently):

- ``topic`` (native and ``schema=kafka``): ``EqualTo``, ``In``, ``StringStartsWith``. A topic
  queue (``t:{topic}``: every queue of a ``topicFilter`` query but a held filter's) holds one
  topic, so a queue whose topic fails a predicate is left out of the plan and the predicate is
  fully honoured -- unless the query also reads a queue of mixed topics (a wildcard queue
  ``w:...``: another queue named in ``queues``, or the held filter's queue of the presence
  events that a ``topicFilter`` overlaps), whose rows Spark must still check: then it goes back
  to Spark too.
- ``timestamp`` (the store time): ``GreaterThan``, ``GreaterThanOrEqual``, ``LessThan``,
  ``LessThanOrEqual`` become each queue's first and end offsets through the index's time lookup
  (``client.offsets_for_times``, as ``startingTimestamp`` does). Store times are milliseconds and
  the bounds are rounded to keep every row that may match; these filters also go back to Spark,
  which checks the rows of the narrowed ranges.

Not pushed (Spark applies them after the read): other columns, ``Not``, ``IsNull``, string
ends/contains, ORs (Spark does not offer them), and every filter of a streaming query (the
Python streaming reader has no ``pushFilters``).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from protocols.queue_names import topic_of_queue

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_US = datetime.timedelta(microseconds=1)


@dataclass(slots=True)
class Pushed:
    """What a batch query's pushed filters ask of the plan (picklable; empty: no change)."""

    topics: frozenset[str] | None = None  # the topic is one of these (EqualTo, In)
    prefixes: tuple[str, ...] = ()  # ... and starts with each of these
    from_ms: int | None = None  # store time at or after (ms)
    until_ms: int | None = None  # store time before (ms)

    def keeps(self, queue: str) -> bool:
        """Whether ``queue`` may hold rows that pass the topic predicates (a queue of mixed
        topics may: Spark checks its rows)."""
        topic = topic_of_queue(queue)
        if topic is None:
            return True
        return ((self.topics is None or topic in self.topics)
                and all(topic.startswith(p) for p in self.prefixes))

    def narrow(self, client, start: dict[str, int], end: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """The queues and [start, end) ranges left of a planned batch read."""
        kept = [q for q in end if self.keeps(q)]
        start = {q: start[q] for q in kept}
        end = {q: end[q] for q in kept}
        live = [q for q in kept if end[q] > start[q]]
        if self.from_ms is not None and live:
            found = client.offsets_for_times(dict.fromkeys(live, self.from_ms))
            for q in live:  # None: every stored message is earlier
                start[q] = min(end[q], max(start[q], end[q] if found.get(q) is None else found[q]))
        if self.until_ms is not None and live:
            found = client.offsets_for_times(dict.fromkeys(live, self.until_ms))
            for q in live:  # None: every stored message is earlier, so all of them stay
                if found.get(q) is not None:
                    end[q] = max(start[q], min(end[q], found[q]))
        return start, end


def _micros(value) -> int | None:
    """A pushed timestamp literal as microseconds since the epoch (None: not one we can use)."""
    if not isinstance(value, datetime.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // _US


def push(filters: Sequence[Filter], queues: Iterable[str] | None) -> tuple[Pushed, list[Filter]]:
    """The plan's ``Pushed`` and the filters Spark must still apply (the same objects).
    ``queues``: the queues the query names, or of a topicFilter query those that are not topic
    queues (None: a topicFilter query of topic queues only)."""
    mixed = queues is not None and any(topic_of_queue(q) is None for q in queues)
    pushed = Pushed()
    back: list[Filter] = []
    for f in filters:
        column = getattr(f, "attribute", None)
        value = getattr(f, "value", None)
        if column == ("topic",) and isinstance(f, (EqualTo, In)):
            values = (f.value,) if isinstance(f, EqualTo) else tuple(f.value)
            if not all(isinstance(v, str) for v in values):
                back.append(f)
                continue
            pushed.topics = frozenset(values) if pushed.topics is None else pushed.topics & frozenset(values)
            if mixed:
                back.append(f)
        elif column == ("topic",) and isinstance(f, StringStartsWith) and isinstance(value, str):
            pushed.prefixes += (value,)
            if mixed:
                back.append(f)
        elif column == ("timestamp",) and isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
            back.append(f)  # narrowed here; Spark checks the rows of the ranges left
            us = _micros(value)
            if us is None:
                continue
            if isinstance(f, GreaterThan):  # ms * 1000 > us
                low = us // 1000 + 1
            elif isinstance(f, GreaterThanOrEqual):  # ms * 1000 >= us
                low = -(-us // 1000)
            elif isinstance(f, LessThan):  # ms * 1000 < us: before ceil(us / 1000)
                pushed.until_ms = _least(pushed.until_ms, -(-us // 1000))
                continue
            else:  # ms * 1000 <= us: before floor(us / 1000) + 1
                pushed.until_ms = _least(pushed.until_ms, us // 1000 + 1)
                continue
            pushed.from_ms = low if pushed.from_ms is None else max(pushed.from_ms, low)
        else:
            back.append(f)
    if pushed.from_ms is not None and pushed.from_ms < 0:
        pushed.from_ms = 0  # (the read API takes times from the epoch on: all stored times are later)
    if pushed.until_ms is not None and pushed.until_ms < 0:
        pushed.until_ms = 0
    return pushed, back


def _least(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)
