"""What a ``tidemq`` source's task reads (``bridge/spark_source.py`` plans them): queue ranges as
Spark's input partitions, read from the gateway's data API a request of several ranges at a time
(``read_ranges``), with the data-loss check of each range (``failOnDataLoss``), and handed to Spark
as Arrow record batches joined to about ``SHIP_ROWS`` rows. Runs on Spark's executors: it loads
none of the store's code (a worker reads through the gateway).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from .data_client import RANGES_PER_READ, Fetch, client_for
from .kafka_options import KafkaOptions
from .pruning import Projection, projection
from .spark_options import Connection, OptionError
from .worker_gc import freeze_imports

log = logging.getLogger("tidemq.spark")


class DataLossError(RuntimeError):
    """Offsets a query needs are no longer in the store (and failOnDataLoss is true)."""


class QueueRange(InputPartition):
    """Offsets [start, end) of one queue, and how to read them (picklable)."""

    def __init__(self, queue: str, start: int, end: int, connection: Connection, fail_on_data_loss: bool,
                 fetch_rows: int) -> None:
        super().__init__((queue, start, end))
        self.queue = queue
        self.start = start
        self.end = end
        self.connection = connection
        self.fail_on_data_loss = fail_on_data_loss
        self.fetch_rows = fetch_rows

    def __repr__(self) -> str:
        return f"QueueRange({self.queue!r}, {self.start}, {self.end})"


class QueueRanges(InputPartition):
    """Several short queue ranges read one after the other by one task (``planning.pack``)."""

    def __init__(self, ranges: list[QueueRange]) -> None:
        super().__init__(tuple(r.value for r in ranges))
        self.ranges = ranges

    def __repr__(self) -> str:
        return f"QueueRanges({self.ranges!r})"


# Rows per batch handed to Spark: a partition's short queue ranges (a topic with a few thousand
# messages) are joined into batches of about this many rows, as each batch costs Spark's JVM side
# a fixed amount to take in (1M rows in 1,000-row batches took ~0.15 s more JVM CPU than in
# 250,000-row ones); ``SHIP_BYTES`` bounds a joined batch's size in memory. The store's own full
# batches pass as they are: no copy for long ranges. The store's batch size
# (``store.read.columns.BATCH_ROWS``: a test checks that they agree), not imported from it:
# a worker reading through the gateway loads none of the store's code.
SHIP_ROWS = 32_768
SHIP_BYTES = 32 << 20


def read_any(part: InputPartition, columns: Projection) -> Iterator[pa.RecordBatch]:
    """The rows of a planned partition (a queue range or several) with the query's columns, in
    batches of at least ``SHIP_ROWS`` rows (but the last)."""
    freeze_imports()
    if isinstance(part, QueueRanges):
        yield from joined(read_ranges(part.ranges, columns))
    elif isinstance(part, QueueRange):
        yield from joined(read_ranges([part], columns))
    # else an empty plan (start == end everywhere): PySpark runs one InputPartition(None) instead


def joined(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` (of one schema) joined into batches of at least ``SHIP_ROWS`` rows (the last
    may be shorter) or ``SHIP_BYTES`` bytes, in order; a batch as big alone passes as it is."""
    waiting: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        waiting.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
        if rows >= SHIP_ROWS or size >= SHIP_BYTES:
            yield waiting[0] if len(waiting) == 1 else pa.concat_batches(waiting)
            waiting, rows, size = [], 0, 0
    if waiting:
        yield waiting[0] if len(waiting) == 1 else pa.concat_batches(waiting)


def data_loss(queue: str, start: int, end: int, fail: bool, why: str) -> None:
    """Offsets [start, end) of ``queue`` cannot be read: fail, or log that they are skipped."""
    text = f"offsets {start}..{end - 1} of queue {queue!r} are lost: {why}"
    if fail:
        raise DataLossError(
            f"tidemq source: {text}. The query needed them. Set failOnDataLoss=false to skip lost "
            "messages with a warning, or start the query afresh (new checkpoint).")
    log.warning("data loss, skipping %d messages: %s (failOnDataLoss=false)", end - start, text)


def read_partition(part: QueueRange, columns: Projection | None = None) -> Iterator[pa.RecordBatch]:
    """Executor side: the rows of one queue range (``read_ranges``)."""
    return read_ranges([part], columns)


def read_ranges(parts: list[QueueRange], columns: Projection | None = None) -> Iterator[pa.RecordBatch]:
    """Executor side: the rows of queue ranges (of one connection), in order, with the query's
    columns (all native ones without ``columns``). The ranges not yet read to their end are
    asked for together, ``fetch_rows`` rows a request; only the store columns the query needs
    are fetched (``bridge/pruning.py``)."""
    columns = columns or projection(None, KafkaOptions())
    client = client_for(parts[0].connection)
    pending = [(part, part.start) for part in parts if part.start < part.end]
    while pending:
        fetches = client.read_many([(part.queue, at, part.end) for part, at in pending[:RANGES_PER_READ]],
                                   parts[0].fetch_rows, columns.fetch)
        assert fetches, "a read of several ranges served none"
        after = []
        pieces: list[tuple[pa.RecordBatch, str]] = []
        for (part, at), fetch in zip(pending, fetches):
            at, batches = advance(part, at, fetch)
            pieces.extend((batch, part.queue) for batch in batches)
            if at < part.end:
                after.append((part, at))
        if pieces:  # (a request's rows shaped at once: one column build, not one a range)
            yield columns.shape(pieces)
        pending = after + pending[len(fetches):]


def advance(part: QueueRange, at: int, fetch: Fetch) -> tuple[int, list[pa.RecordBatch]]:
    """Where a range read up to ``at`` goes on after ``fetch`` (its end: nothing more to read),
    and the fetch's rows. Offsets lost meanwhile are reported (``data_loss``) and skipped."""
    if fetch.first_offset > at:
        lost_to = min(fetch.first_offset, part.end)
        data_loss(part.queue, at, lost_to, part.fail_on_data_loss,
                  f"retention removed them (the earliest offset still stored is {fetch.min_offset})")
        at = lost_to
        if not fetch.batches:
            return at, []  # the whole fetch was gone: read on from the first offset still stored
    if fetch.next_offset <= at:
        if at < part.end:  # the queue no longer reaches the end of the range
            why = ("the queue is gone from the store" if not fetch.exists else
                   f"the queue now ends at offset {fetch.max_offset} (was the store replaced or cut?)")
            data_loss(part.queue, at, part.end, part.fail_on_data_loss, why)
        return part.end, []
    return fetch.next_offset, fetch.batches


def past_end(queue: str, start: int, high: int) -> None:
    """A starting offset past the queue's end is a wrong option, not lost data: say so."""
    if start > high:
        raise OptionError(f"tidemq source: startingOffsets for queue {queue!r} is {start}, past the queue's end "
                          f"({high}: the next message will get offset {high})")
