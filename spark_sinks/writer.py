"""``tidemq`` as a Spark sink: DataFrame rows published into TideMQ topics, as MQTT messages
(so MQTT devices and AMQP apps bound to ``amq.topic`` get them), batch and Structured Streaming.

    alerts.writeStream.format("tidemq").option("address", "gateway:9100").option("checkpointLocation", ckpt).start()
    df.write.format("tidemq").option("address", "gateway:9100").mode("append").save()

Rows: ``topic`` (string) and ``payload`` (binary or string), and optionally ``qos`` (0-2,
default the ``qos`` option, 1), ``retain`` (bool, default the ``retain`` option, false),
``properties`` (map string -> string: MQTT 5.0 user properties) and ``key`` (the message key).
Other columns are an error: select what to publish.

Executors publish through the gateway's ``POST /data/publish`` (``gateway/http/data_publish.py``):
each task sends its partition's Arrow record batches as they come from Spark (no per-row
Python work), in chunks of at most ``maxRowsPerRequest`` rows / ``maxBytesPerRequest`` bytes.

At least once, without duplicates on retry: every chunk carries a batch key that is the same
when Spark runs the same data again -- ``{writer}/{batch}/{partition}/{chunk}`` with writer =
the streaming query's id (stable across restarts from its checkpoint; Spark passes it, and the
micro-batch id, to tasks as the local properties ``sql.streaming.queryId`` and
``streaming.sql.batchId``), prefixed by the ``writerId`` option when given; batch = the
micro-batch id; partition = the task's partition id; chunk = its place in the partition. The
gateway stores a key's rows once and answers a repeated key from memory, so a retried task, a
re-run micro-batch after a crash or ``query.stop()``, and a retry after a lost answer publish
nothing twice. What this relies on: a re-run micro-batch has the same rows in the same
partitions in the same order, true for the ``tidemq`` source (a batch re-reads its planned
offsets) followed by deterministic transformations; it is Spark's own assumption for
idempotent sinks. What it does not cover: a gateway crash between storing a chunk and
remembering its key (the chunk is stored again: at least once).

Batch writes (``df.write``): inside ``foreachBatch`` the query id and batch id are found the
same way, so a ``df.write.format("tidemq")`` there is idempotent per micro-batch too (give each
write of one ``foreachBatch`` its own ``writerId``). Elsewhere the key is ``writerId`` and
``batchId`` when given (run a job again with the same ones: nothing is published twice), else
a random writer id per job (task retries deduplicated, a second run publishes again).

Rows the gateway refuses (no topic, an invalid MQTT topic, a payload over its maximum packet
size...) fail the task with the gateway's reasons (``failOnBadRows`` true, the default; the
other rows of that chunk are published), or are counted and logged (false).
"""

from __future__ import annotations

import io
import json
import logging
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from bridge.data_client import GaveUp, HttpClient, Retries, error_text
from bridge.spark_options import Connection, OptionError, parse_bool, parse_positive
from bridge.spark_source import TideMQSource

log = logging.getLogger("tidemq.spark")

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DEFAULT_MAX_ROWS_PER_REQUEST = 10_000
DEFAULT_MAX_BYTES_PER_REQUEST = 8 << 20  # the gateway takes up to 32 MiB
DEFAULT_ATTEMPTS = 20  # ~2 min of backoff (as the source's retryTimeoutMs): a gateway restart, a resource alarm
QUERY_ID = "sql.streaming.queryId"  # Spark's local properties of a streaming query's tasks
BATCH_ID = "streaming.sql.batchId"
SPARK_OPTIONS = ("path", "checkpointlocation", "queryname")  # Spark's own, passed to every writer

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
COLUMNS: dict[str, tuple[str, tuple[type[DataType], ...]]] = {
    "topic": ("string", (StringType,)),
    "payload": ("binary or string", (BinaryType, StringType)),
    "qos": ("an integer", _INTEGRAL),
    "retain": ("boolean", (BooleanType,)),
    "properties": ("map<string,string>", (MapType,)),
    "key": ("string", (StringType,)),
}


class PublishError(RuntimeError):
    """The gateway refused rows or a request, or could not be reached after retries."""


@dataclass(frozen=True, slots=True)
class SinkOptions:
    connection: Connection
    writer_id: str | None = None
    batch_id: int | None = None
    qos: int = 1
    retain: bool = False
    max_rows_per_request: int = DEFAULT_MAX_ROWS_PER_REQUEST
    max_bytes_per_request: int = DEFAULT_MAX_BYTES_PER_REQUEST
    fail_on_bad_rows: bool = True
    attempts: int = DEFAULT_ATTEMPTS

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = {k.lower(): v for k, v in options.items() if k.lower() not in SPARK_OPTIONS}
        known = {"address", "token", "username", "password", "writerid", "batchid", "qos", "retain", "maxrowsperrequest",
                 "maxbytesperrequest", "failonbadrows", "attempts"}
        if "datadir" in opts:
            raise OptionError("tidemq sink: dataDir is for reading; publish through a gateway's address")
        unknown = sorted(set(opts) - known)
        if unknown:
            raise OptionError(f"tidemq sink: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if not opts.get("address"):
            raise OptionError("tidemq sink: address is required (a gateway's --metrics-bind HOST:PORT)")
        writer_id = opts.get("writerid") or None
        if writer_id is not None and ("/" in writer_id or len(writer_id) > 200):
            raise OptionError("tidemq sink: writerId must be at most 200 characters, without '/'")
        qos = opts.get("qos", "1").strip()
        if qos not in ("0", "1", "2"):
            raise OptionError(f"tidemq sink: qos must be 0, 1 or 2, not {qos!r}")
        batch_id = opts.get("batchid")
        if batch_id is not None and (not batch_id.strip().isdigit()):
            raise OptionError(f"tidemq sink: batchId must be a whole number of 0 or more, not {batch_id!r}")
        return cls(
            connection=Connection.of(opts, "sink"),
            writer_id=writer_id,
            batch_id=int(batch_id) if batch_id is not None else None,
            qos=int(qos),
            retain=parse_bool(opts.get("retain", "false"), "retain"),
            max_rows_per_request=parse_positive(opts, "maxrowsperrequest", "maxRowsPerRequest")
            or DEFAULT_MAX_ROWS_PER_REQUEST,
            max_bytes_per_request=parse_positive(opts, "maxbytesperrequest", "maxBytesPerRequest")
            or DEFAULT_MAX_BYTES_PER_REQUEST,
            fail_on_bad_rows=parse_bool(opts.get("failonbadrows", "true"), "failOnBadRows"),
            attempts=parse_positive(opts, "attempts", "attempts") or DEFAULT_ATTEMPTS,
        )


def check_schema(schema: StructType) -> None:
    """The columns a sink DataFrame may have, with their types (checked on the driver)."""
    names = schema.fieldNames()
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise OptionError(f"tidemq sink: unknown column(s) {', '.join(unknown)}; rows have topic and payload, and "
                          "optionally qos, retain, properties, key (select what to publish)")
    for required in ("topic", "payload"):
        if required not in names:
            raise OptionError(f"tidemq sink: rows need a {required} column")
    for f in schema.fields:
        what, types = COLUMNS[f.name]
        ok = isinstance(f.dataType, types)
        if ok and isinstance(f.dataType, MapType):
            ok = isinstance(f.dataType.keyType, StringType) and isinstance(f.dataType.valueType, StringType)
        if not ok:
            raise OptionError(f"tidemq sink: column {f.name} must be {what}, not {f.dataType.simpleString()}")


@dataclass
class PublishedPartition(WriterCommitMessage):
    """What one task published (sent back to the driver's commit)."""

    partition: int
    rows: int = 0
    stored: int = 0
    repeated_rows: int = 0  # rows of chunks the gateway had already stored (a retry)
    bad_rows: int = 0
    errors: list[str] = field(default_factory=list)


def publish_retries(attempts: int) -> Retries:
    """A publish is made ``attempts`` times at most, again after a connection error or a 5xx
    answer, 0.1 s later and then four times longer each time, 8 s at the longest."""
    return Retries(range(500, 1000), 0.1, 4, 8.0, attempts=attempts)


class PublishClient(HttpClient):
    """``POST /data/publish`` with retries: every request carries a batch key, so repeating one
    whose answer was lost is safe."""

    def publish(self, body: bytes, params: dict[str, object], attempts: int) -> dict:
        path = "/data/publish?" + urllib.parse.urlencode(params)
        headers = {**self._headers, "Content-Type": ARROW_STREAM}
        try:
            status, _, data = self.exchange("POST", path, body, headers, publish_retries(attempts), "sink")
        except GaveUp as exc:
            raise PublishError(f"tidemq sink: {exc.problem} (gave up after {exc.attempts} attempts)") from None
        if status != 200:
            raise PublishError(f"tidemq sink: {self.url}/data/publish answered {status}: {error_text(data)}")
        return json.loads(data)


_CLIENTS: dict[Connection, PublishClient] = {}


def publish_client(connection: Connection) -> PublishClient:
    """This process's client for ``connection`` (Spark reuses Python workers across tasks)."""
    client = _CLIENTS.get(connection)
    if client is None:
        client = _CLIENTS[connection] = PublishClient.of(connection)
    return client


def chunks(batches: Iterator[pa.RecordBatch], max_rows: int, max_bytes: int) -> Iterator[list[pa.RecordBatch]]:
    """Record batches grouped into requests of at most ``max_rows`` rows and about ``max_bytes``
    bytes (a row larger than that goes alone). Deterministic: the same input, the same chunks
    (the batch keys depend on it)."""
    group: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        at = 0
        while at < batch.num_rows:
            take = min(batch.num_rows - at, max_rows - rows)
            piece = batch.slice(at, take)
            while take > 1 and size + piece.nbytes > max_bytes:  # halve until it fits what is left
                take //= 2
                piece = batch.slice(at, take)
            if group and size + piece.nbytes > max_bytes:
                yield group
                group, rows, size = [], 0, 0
                continue
            group.append(piece)
            rows, size, at = rows + take, size + piece.nbytes, at + take
            if rows >= max_rows:
                yield group
                group, rows, size = [], 0, 0
    if group:
        yield group


def arrow_body(batches: list[pa.RecordBatch]) -> bytes:
    """One request body: the batches as an Arrow IPC stream, string payloads as binary."""
    schema = batches[0].schema
    at = schema.get_field_index("payload")
    if pa.types.is_string(schema.field(at).type) or pa.types.is_large_string(schema.field(at).type):
        schema = schema.set(at, pa.field("payload", pa.binary()))
        batches = [pa.RecordBatch.from_arrays([c.cast(pa.binary()) if i == at else c
                                               for i, c in enumerate(b.columns)], schema=schema) for b in batches]
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema) as stream:
        for batch in batches:
            stream.write_batch(batch)
    return sink.getvalue()


class _Writer:
    """What the batch and the stream writer share: the executor side of a task."""

    def __init__(self, options: SinkOptions, fallback_writer: str | None) -> None:
        self.options = options
        self.fallback_writer = fallback_writer  # batch writes outside a streaming query

    def key(self) -> tuple[str, int, int]:
        """(writer, batch, partition) of the running task."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "runs in a Spark task"
        query = ctx.getLocalProperty(QUERY_ID)
        writer = self.options.writer_id
        if query:
            writer = f"{writer}@{query}" if writer else query
        writer = writer or self.fallback_writer
        batch = self.options.batch_id
        if batch is None:
            batch = int(ctx.getLocalProperty(BATCH_ID) or 0)
        if not writer:
            raise PublishError("tidemq sink: no writer id (not a streaming query and no writerId option)")
        return writer, batch, ctx.partitionId()

    def write(self, batches: Iterator[pa.RecordBatch]) -> PublishedPartition:
        opts = self.options
        writer, batch, partition = self.key()
        client = publish_client(opts.connection)
        done = PublishedPartition(partition)
        params: dict[str, object] = {"writer": writer, "batch": batch, "partition": partition,
                                     "qos": opts.qos, "retain": str(opts.retain).lower()}
        for chunk, group in enumerate(chunks(batches, opts.max_rows_per_request, opts.max_bytes_per_request)):
            answer = client.publish(arrow_body(group), {**params, "chunk": chunk}, opts.attempts)
            done.rows += answer["rows"]
            done.stored += answer["stored"]
            if answer.get("duplicate"):
                done.repeated_rows += answer["rows"]
            if answer["bad_rows"]:
                done.bad_rows += answer["bad_rows"]
                reasons = [f"row {e['row']} of chunk {chunk} (topic {e['topic']!r}): {e['error']}"
                           for e in answer["errors"][:5]]
                done.errors.extend(reasons[:max(0, 5 - len(done.errors))])
                if opts.fail_on_bad_rows:
                    raise PublishError(
                        f"tidemq sink: {answer['bad_rows']} row(s) of partition {partition} could not be published "
                        f"(the chunk's other rows were): {'; '.join(reasons)}. Set failOnBadRows=false to skip "
                        "them with a warning.")
                log.warning("tidemq sink: skipped %d bad row(s): %s", answer["bad_rows"], "; ".join(reasons))
        return done


def _summary(messages: list, batch: int | None) -> str:
    parts = [m for m in messages if isinstance(m, PublishedPartition)]
    where = f" batch={batch}" if batch is not None else ""
    return (f"tidemq sink{where} partitions={len(parts)} rows={sum(m.rows for m in parts)} "
            f"stored={sum(m.stored for m in parts)} repeated_rows={sum(m.repeated_rows for m in parts)} "
            f"bad_rows={sum(m.bad_rows for m in parts)}")


class TideMQBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self._writer = _Writer(options, fallback_writer=f"job-{uuid.uuid4().hex}")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedPartition:
        return self._writer.write(iterator)

    def commit(self, messages: list) -> None:
        log.info("%s", _summary(messages, None))

    def abort(self, messages: list) -> None:
        log.warning("aborted (what was published stays; a rerun with the same writerId and batchId publishes "
                    "the rest only): %s", _summary(messages, None))


class TideMQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self._writer = _Writer(options, fallback_writer=None)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedPartition:
        return self._writer.write(iterator)

    def commit(self, messages: list, batchId: int) -> None:
        log.info("%s", _summary(messages, batchId))

    def abort(self, messages: list, batchId: int) -> None:
        log.warning("aborted (what was published stays; the batch's re-run publishes the rest only): %s",
                    _summary(messages, batchId))


def batch_writer(options: Mapping[str, str], schema: StructType, overwrite: bool) -> TideMQBatchWriter:
    if overwrite:
        raise OptionError("tidemq sink: published messages cannot be taken back; use mode('append')")
    check_schema(schema)
    return TideMQBatchWriter(SinkOptions.parse(options))


def stream_writer(options: Mapping[str, str], schema: StructType) -> TideMQStreamWriter:
    check_schema(schema)
    return TideMQStreamWriter(SinkOptions.parse(options))


class TideMQDataSource(TideMQSource):
    """The ``tidemq`` format both ways: the source (``bridge/spark_source.py``) and this sink,
    ``df.write.format("tidemq")`` / ``df.writeStream.format("tidemq")``. ``spark_sinks.register``
    registers it (Spark has one class per format name)."""

    def writer(self, schema: StructType, overwrite: bool) -> TideMQBatchWriter:
        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TideMQStreamWriter:
        return stream_writer(self.options, schema)
