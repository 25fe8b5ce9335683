"""``tidemq``: a PySpark data source over TideMQ store queues, batch and Structured Streaming,
with the Kafka source's options and semantics (``bridge/spark_options.py``).

    from spark_sinks import register
    register(spark)  # the tidemq format: this source and the sink (spark_sinks/writer.py)
    df = (spark.readStream.format("tidemq").option("address", "gateway:9100")
          .option("topicFilter", "devices/+/telemetry").option("maxOffsetsPerTrigger", 100000).load())

Offsets are ``{queue: next offset to read}`` and live only in Spark's checkpoint (the store
keeps nothing for the query), so a restarted query re-reads exactly the micro-batch it had
planned and goes on from there: nothing lost, nothing twice (with an idempotent sink). A
``topicFilter`` (one MQTT filter or a JSON list) reads the topic queue of every stored topic
that matches, from the query's start (``earliest``: the whole history), and a stream picks up
topics that start matching while it runs at their earliest offset (``bridge/planning.py``).

Partitions: queue ranges longer than ``maxRecordsPerPartition`` (or than needed for
``minPartitions``) split, so executors read in parallel, and consecutive short ranges share a
partition up to that size (many topics with a few messages each make a few tasks; a stream's
micro-batch, ``STREAM_TASK_ROWS``), and a task asks for its ranges together (``spark_partitions.read_ranges``);
``read()`` yields Arrow record batches built without per-row Python work (``store/read/columns.py``).

Data loss (retention removed offsets a query still needs, or a queue now ends before an offset
the query has already read): with ``failOnDataLoss`` true (default) the query fails with
``DataLossError`` naming the queue and offsets; with false, the lost offsets are skipped and a
warning is logged (logger ``tidemq.spark``; on executors it reaches Spark's Python worker
logs). It is checked when a batch is planned (driver) and again while reading (executors),
since retention may run in between.

Admission control uses the full ``DataSourceStreamReader``: ``getDefaultReadLimit`` answers
``ReadMaxRows(maxOffsetsPerTrigger)`` and ``latestOffset(start, limit)`` shares that many
offsets over the queues in proportion to their backlog, as the Kafka source does.
``Trigger.AvailableNow`` reads up to the offsets current when the query started.

The Kafka source's other options live in their own modules, which this one calls:
``kafka_options.py`` (parsing, and the Kafka options refused), ``kafka_schema.py``
(``schema=kafka``), ``timestamps.py`` (starting and ending times), ``trigger_pacing.py``
(``minOffsetsPerTrigger`` / ``maxTriggerDelay``) and ``progress.py`` (offsets behind latest, the
warning for a query that matches nothing). Only what a query needs is read: ``pruning.py`` (the
columns of the query's own schema) and ``pushdown.py`` (topic and time predicates of a batch
query).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from protocols.queue_names import held_queues

from .data_client import ReadingLease, StoreClient, client_for
from .held_rows import HeldRows, read_checked
from .kafka_schema import check_partitions, spark_schema, wants_kafka_schema
from .planning import check_checkpoint, pack, reads_queue, share
from .progress import EmptyWatch
from .pruning import SCHEMA, projection
from .pushdown import Pushed, push
from .spark_partitions import SHIP_ROWS, QueueRange, QueueRanges, data_loss, past_end
from .spark_options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OptionError,
    SourceOptions,
)
from .timestamps import resolve_end, resolve_start
from .trigger_pacing import TriggerPacer

log = logging.getLogger("tidemq.spark")

# Rows a stream's task reads at most when minPartitions is not set: a micro-batch of many short
# topic ranges packed into one task would leave all but one core idle, and each task costs Spark
# a fixed amount (its Python worker's turn, its Arrow stream, its plan): a task is one batch
# handed to Spark (``SHIP_ROWS``)
STREAM_TASK_ROWS = SHIP_ROWS
# A stream lists its filter's topic queues in full this often (in between: what changed)
FULL_LISTING_S = 30.0


class _Planner:
    """What the batch and the stream reader share: the client, the queues, offset resolution
    and splitting ranges into partitions. Holds no client when pickled (Spark ships readers to
    executors)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._matched: bool | None = None  # did the topicFilter match a topic when last listed?
        self._last: dict[str, tuple[int, int]] | None = None  # the stream's listing of this trigger
        self._known: dict[str, tuple[int, int]] | None = None  # the filter's queues as last listed
        self._cursor: str | None = None  # ... and the cursor to ask for what changed since
        self._full_at = 0.0  # when the filter's queues were last listed in full (monotonic)

    def listed(self) -> dict[str, tuple[int, int]]:
        """The offsets the stream's latestOffset listed in this trigger, or fresh ones (a query
        restarted from its checkpoint plans its last batch first). Spark asks for partitions and
        for the latest offsets (progress) right after latestOffset: one listing of a filter's
        topics a trigger, not three."""
        return self._last if self._last is not None else self.offsets()

    @property
    def client(self) -> StoreClient:
        return client_for(self.options.connection)

    def offsets(self, *, must_exist: bool = False) -> dict[str, tuple[int, int]]:
        """(first readable, next) offset of each queue; a queue not (yet) in the store is (0, 0),
        or an error with ``must_exist`` (a batch query of a misspelt queue should say so). A
        topicFilter's queues are listed afresh each time (new topics join)."""
        opts = self.options
        if opts.topic_filters:
            return self._filter_offsets()
        found = self.client.offsets(list(opts.queues))
        missing = [q for q, o in found.items() if o is None]
        if missing and must_exist:
            raise OptionError(f"tidemq source: no queue {', '.join(map(repr, missing))} in the store")
        if missing:
            log.info("queues not in the store (yet): %s", ", ".join(missing))
        return {q: o if o is not None else (0, 0) for q, o in found.items()}

    def _filter_offsets(self) -> dict[str, tuple[int, int]]:
        """The filter's topic queues: what changed since the last listing merged into it (the
        gateway's ``since``), all of them every ``FULL_LISTING_S`` (first offsets move with
        retention, removed queues leave no change behind) or when the gateway says so."""
        filters = self.options.topic_filters
        now = time.monotonic()
        incremental = self._known is not None and self._cursor is not None and now - self._full_at < FULL_LISTING_S
        listing = self.client.topic_listing(list(filters), self._cursor if incremental else None)
        if listing.complete:
            self._known, self._full_at = dict(listing.queues), now
        else:
            assert self._known is not None
            self._known.update(listing.queues)
        self._cursor = listing.cursor
        found = dict(self._known)
        matched = bool(found)
        if matched != self._matched:  # said once, and again when it changes
            if matched:
                log.info("tidemq source: topicFilter %s matches %d topic queue(s)", list(filters), len(found))
            else:
                log.warning("tidemq source: topicFilter %s matches no stored topic (yet)%s", list(filters),
                            " that this user may read" if self.options.connection.username else "")
            self._matched = matched
        for spec in (self.options.starting_offsets, self.options.ending_offsets):
            if isinstance(spec, dict):  # a queue named by the offsets that has no message yet
                for queue in spec:
                    if queue not in found and reads_queue(filters, queue):
                        found[queue] = (0, 0)
        return found

    def __getstate__(self) -> dict:  # (a listing may be large: executors need none)
        return {**self.__dict__, "_last": None, "_known": None, "_cursor": None}

    def check_checkpoint(self, offsets: dict, what: str) -> None:
        """A filter query's offsets from Spark (checkpoint) must be those of its topic queues."""
        if self.options.topic_filters:
            check_checkpoint(self.options.topic_filters, offsets, what)

    def resolve(self, spec: OffsetSpec, offsets: dict[str, tuple[int, int]], default: int, name: str) -> dict[str, int]:
        if isinstance(spec, str):
            spec = {}.fromkeys(offsets, EARLIEST if spec == "earliest" else LATEST)
        extra = sorted(set(spec) - set(offsets))
        if extra:
            raise OptionError(f"tidemq source: {name} names queues the query does not read: {', '.join(extra)}")
        out = {}
        for queue, (low, high) in offsets.items():
            wanted = spec.get(queue, default)
            out[queue] = low if wanted == EARLIEST else high if wanted == LATEST else wanted
        return out

    def check_start(self, start: dict[str, int], end: dict[str, int],
                    offsets: dict[str, tuple[int, int]]) -> dict[str, int]:
        """Planning-time data-loss check of the ranges [start, end); returns the starts to plan
        from (lost offsets skipped)."""
        fail = self.options.fail_on_data_loss
        out = dict(start)
        for queue, at in start.items():
            low, _ = offsets.get(queue, (0, 0))
            stop = end.get(queue, at)
            if at < low and at < stop:
                data_loss(queue, at, min(low, stop), fail,
                          f"retention removed them (the earliest offset still stored is {low})")
                out[queue] = min(low, stop)
        return out

    def partitions(self, start: dict[str, int], end: dict[str, int], *, stream: bool = False) -> list[InputPartition]:
        """The ranges [start, end) as partitions; a stream's micro-batch without ``minPartitions``
        in tasks of at most ``STREAM_TASK_ROWS`` rows, so that executors' cores share it, and a
        stream's tasks of about equal rows (``planning.share``)."""
        opts = self.options
        if opts.kafka.schema == "kafka":
            check_partitions(end)
        ranges = [(q, start.get(q, 0), end[q]) for q in sorted(end) if end[q] > start.get(q, 0)]
        total = sum(e - s for _, s, e in ranges)
        size = opts.max_records_per_partition
        if opts.min_partitions and total:
            size = max(1, min(size, math.ceil(total / opts.min_partitions)))
        elif stream:
            size = min(size, STREAM_TASK_ROWS)
        tasks = max(1, math.ceil(total / size))
        if stream:
            size = max(1, math.ceil(total / tasks))  # tasks of about equal rows (``share``)
        parts: list[QueueRange] = []
        for queue, s, e in ranges:
            pieces = math.ceil((e - s) / size)
            step = math.ceil((e - s) / pieces)
            for lo in range(s, e, step):
                parts.append(QueueRange(queue, lo, min(e, lo + step), opts.connection, opts.fail_on_data_loss,
                                        opts.fetch_rows))
        sizes = [p.end - p.start for p in parts]
        groups = share(sizes, tasks) if stream else pack(sizes, size)
        return [parts[g[0]] if len(g) == 1 else QueueRanges([parts[i] for i in g]) for g in groups]


class TideMQBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        if options.starting_offsets == "latest":
            raise OptionError("tidemq source: startingOffsets=latest makes no sense for a batch query")
        if options.ending_offsets == "earliest":
            raise OptionError("tidemq source: endingOffsets=earliest makes no sense for a batch query")
        if options.max_offsets_per_trigger is not None:
            raise OptionError("tidemq source: maxOffsetsPerTrigger is for streaming queries only")
        options.kafka.check_mode(streaming=False)
        self.planner = _Planner(options)
        self.columns = projection(schema, options.kafka)
        self.held = HeldRows.of(options.topic_filters, self.columns, schema, options.kafka)
        self.pushed = Pushed()

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        """Topic and time predicates narrow the plan (``bridge/pushdown.py``); the filters not
        fully honoured go back to Spark."""
        options = self.planner.options
        # (a topicFilter query reads topic queues, and a held filter's queue of many topics)
        queues = (held_queues(options.topic_filters) or None) if options.topic_filters else options.queues
        self.pushed, back = push(filters, queues)
        return back

    def partitions(self) -> list[InputPartition]:
        planner = self.planner
        offsets = planner.offsets(must_exist=True)
        kafka = planner.options.kafka
        start = (resolve_start(planner.client, kafka, offsets) if kafka.starts_by_time else
                 planner.resolve(planner.options.starting_offsets or "earliest", offsets, EARLIEST, "startingOffsets"))
        end = (resolve_end(planner.client, kafka, offsets) if kafka.ends_by_time else
               planner.resolve(planner.options.ending_offsets, offsets, LATEST, "endingOffsets"))
        for queue, (_, high) in offsets.items():
            past_end(queue, start[queue], high)
            if end[queue] < start[queue]:
                raise OptionError(f"tidemq source: for queue {queue!r} endingOffsets ({end[queue]}) is before "
                                  f"startingOffsets ({start[queue]})")
            if end[queue] > high:
                raise OptionError(f"tidemq source: endingOffsets for queue {queue!r} is {end[queue]}, but the "
                                  f"queue ends at {high} (the next message will get offset {high})")
        start, end = self.pushed.narrow(planner.client, start, end)
        start = planner.check_start(start, end, offsets)
        return planner.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_checked(partition, self.columns, self.held)


class TideMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, schema: StructType | None = None) -> None:
        if options.ending_offsets != "latest":
            raise OptionError("tidemq source: endingOffsets is for batch queries only")
        options.kafka.check_mode(streaming=True)
        self.planner = _Planner(options)
        self.columns = projection(schema, options.kafka)
        self.held = HeldRows.of(options.topic_filters, self.columns, schema, options.kafka)
        kafka = options.kafka
        self._pacer = (TriggerPacer(kafka.min_offsets_per_trigger, kafka.max_trigger_delay_s)
                       if kafka.min_offsets_per_trigger else None)
        self._empty = EmptyWatch(f"topicFilter {', '.join(map(repr, options.topic_filters))}" if options.topic_filters else
                                 f"queues {', '.join(options.queues)}")
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: stop here
        self._cut: set[str] = set()  # queues found ending before the query's offset
        self._initial: dict[str, int] | None = None  # initialOffset's answer
        # the gateway counts the query as a reader of its topics while it runs (store/retention/reclaim.py)
        self._lease = ReadingLease(options.connection, options.topic_filters, options.filter_lease_s)

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts, resolved once: Spark asks again to plan
        the first micro-batch, and ``latest`` listed anew would skip what came in between."""
        if self._initial is None:
            self._lease.start()
            offsets = self.planner.offsets()
            kafka = self.planner.options.kafka
            start = (resolve_start(self.planner.client, kafka, offsets) if kafka.starts_by_time else
                     self.planner.resolve(self.planner.options.starting_offsets or "latest", offsets, LATEST,
                                          "startingOffsets"))
            for queue, (_, high) in offsets.items():
                past_end(queue, start[queue], high)
            self._initial = start
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.planner.options.max_offsets_per_trigger
        least = self.planner.options.kafka.min_offsets_per_trigger
        # with both, Spark hands back the maximum and the pacer keeps the minimum (Kafka's
        # composite limit is not open to Python sources)
        return ReadMaxRows(limit) if limit else ReadMinRows(least) if least else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self.planner.check_checkpoint(start, "start")
        self._lease.start()  # (a query restarted from its checkpoint starts here)
        offsets = self.planner._last = self.planner.offsets()
        self._empty.check(offsets)
        latest = dict(start)  # a queue no longer listed (removed, or no longer readable) keeps its offset
        begin = dict(start)
        for queue, (low, high) in offsets.items():
            at = start.get(queue)
            if at is None:  # a topic that started matching: read from its earliest offset (subscribePattern)
                if self._target is not None and queue not in self._target:
                    continue  # Trigger.AvailableNow reads what was there when it started
                at = begin[queue] = low
            if at > high and queue not in self._cut:
                self._cut.add(queue)  # reported once; the query waits until the queue passes `at` again
                data_loss(queue, high, at, self.planner.options.fail_on_data_loss,
                          f"the query has read up to offset {at} but the queue now ends at {high} "
                          "(was the store replaced or cut?)")
            target = high if self._target is None else min(high, self._target.get(queue, high))
            latest[queue] = max(at, target)
        # Trigger.AvailableNow (a target) waits for nothing: what is left up to it is all there is
        pacer = self._pacer if self._target is None and not isinstance(limit, ReadAllAvailable) else None
        if pacer is not None and not pacer.admit(sum(high - begin.get(q, 0) for q, high in latest.items())):
            return dict(start)  # fewer than minOffsetsPerTrigger, within maxTriggerDelay: no batch
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict:
        return {queue: high for queue, (_, high) in self.planner.listed().items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {queue: high for queue, (_, high) in self.planner.offsets().items()}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if start == end:
            return []
        self.planner.check_checkpoint(start, "start")
        self.planner.check_checkpoint(end, "end")
        offsets = self.planner.listed()
        # a queue new to the query starts at its earliest offset (as latestOffset planned it)
        first = {q: start[q] if q in start else offsets.get(q, (0, 0))[0] for q in end}
        begin = self.planner.check_start(first, end, offsets)
        return self.planner.partitions({**start, **begin}, end, stream=True)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_checked(partition, self.columns, self.held)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, and the store keeps every message
        until retention, whatever a query has read."""

    def stop(self) -> None:
        self._lease.stop()


def rate_limit(start: dict[str, int], latest: dict[str, int], max_rows: int) -> dict[str, int]:
    """At most ``max_rows`` offsets past ``start`` in all, shared in proportion to each queue's
    backlog (the remainder goes one by one to the queues with most left, in name order)."""
    backlog = {q: latest[q] - start[q] for q in latest if latest[q] > start[q]}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    share = {q: max_rows * n // total for q, n in backlog.items()}
    left = max_rows - sum(share.values())
    for q in sorted(backlog, key=lambda q: (-(backlog[q] - share[q]), q)):
        if left == 0:
            break
        if share[q] < backlog[q]:
            share[q] += 1
            left -= 1
    return {q: start[q] + share.get(q, 0) for q in latest}


class TideMQSource(DataSource):
    """``spark.read.format("tidemq")`` / ``spark.readStream.format("tidemq")``. The format also
    writes: ``spark_sinks.writer.TideMQDataSource`` adds the sink to this class, and is what
    ``spark_sinks.register`` registers (Spark has one class per format name, and the sink's
    package depends on this one, not the other way)."""

    @classmethod
    def name(cls) -> str:
        return "tidemq"

    def schema(self) -> StructType:
        kafka, headers = wants_kafka_schema(self.options)
        return spark_schema(headers) if kafka else SCHEMA

    def reader(self, schema: StructType) -> TideMQBatchReader:
        return TideMQBatchReader(SourceOptions.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> TideMQStreamReader:
        return TideMQStreamReader(SourceOptions.parse(self.options), schema)
