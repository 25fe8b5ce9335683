"""``schema=kafka``: the rows of the tidemq source in exactly the columns and types of Spark's Kafka
source, so that a job written against the Kafka source runs unchanged when ``format`` and the
connection options change. Built on the executors from the native Arrow batches, column by
column (no per-row Python work).

    key            binary     the message key (remoting KEYS, AMQP message-id, an MQTT 5 user property
                              "key"), null if none
    value          binary     the payload
    topic          string     the message's topic (the MQTT topic; for a wildcard queue, each
                              message's own topic)
    partition      int        the queue: crc32 of its name, masked to 31 bits (see partition_of)
    offset         long       the offset in the queue
    timestamp      timestamp  the store time: when the store wrote the message
    timestampType  int        1 (LogAppendTime): the timestamp is the store's, not the producer's
                              (the producer's, where there is one, is born_timestamp of the native schema)
    headers        array<struct<key:string,value:binary>>  with includeHeaders=true: the stored
                              message properties, as the native ``properties`` column has them
                              (``mqtt.cid``; an MQTT 5 property block as ``mqtt.props``, base64;
                              AMQP and remoting properties), in stored order; null when there are
                              none, as Kafka's

Why a hash for ``partition`` and not the position of the queue among the query's queues: a
partition number must mean the same queue across restarts of a query and while the set of queues
grows (new topics under a filter), and a position changes when a queue sorting before it
appears. Two queues of one query whose numbers collide (about n*n/2**32 for n queues) make the
query fail at planning (``check_partitions``) rather than mix two queues under one number.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

LOG_APPEND_TIME = 1  # Kafka's TimestampType.LOG_APPEND_TIME (0 is CREATE_TIME)

KAFKA_SCHEMA = StructType([  # KafkaRecordToRowConverter's schema (all nullable there)
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
HEADERS_FIELD = StructField("headers", ArrayType(StructType([
    StructField("key", StringType()), StructField("value", BinaryType())])))
KAFKA_SCHEMA_WITH_HEADERS = StructType([*KAFKA_SCHEMA.fields, HEADERS_FIELD])

_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_ARROW = pa.schema([
    pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("timestampType", pa.int32()),
])
_ARROW_WITH_HEADERS = _ARROW.append(pa.field("headers", pa.list_(pa.field("element", _HEADER_TYPE))))


def wants_kafka_schema(options: Mapping[str, str]) -> tuple[bool, bool]:
    """(schema=kafka, includeHeaders) from the raw options, for ``DataSource.schema()``; wrong
    values are refused when the reader parses them all (``kafka_options``)."""
    opts = {k.lower(): v.strip().lower() for k, v in options.items()}
    return opts.get("schema") == "kafka", opts.get("includeheaders") == "true"


def spark_schema(include_headers: bool) -> StructType:
    return KAFKA_SCHEMA_WITH_HEADERS if include_headers else KAFKA_SCHEMA


def partition_of(queue: str) -> int:
    """The ``partition`` of a queue's rows: stable for a queue name, whatever else is read."""
    return zlib.crc32(queue.encode()) & 0x7FFF_FFFF


def check_partitions(queues: Iterable[str]) -> None:
    from .spark_options import OptionError

    seen: dict[int, str] = {}
    for queue in sorted(queues):
        other = seen.setdefault(partition_of(queue), queue)
        if other != queue:
            raise OptionError(f"tidemq source: queues {other!r} and {queue!r} have the same partition number "
                              f"({partition_of(queue)}) under schema=kafka; read them in separate queries or with "
                              "the native schema (its queue column names the queue)")


# the store column (store.columns.ARROW_SCHEMA) behind each Kafka column; None: made per batch
KAFKA_NATIVE = {"key": "key", "value": "payload", "topic": "topic", "partition": None, "offset": "offset",
                "timestamp": "timestamp", "timestampType": None, "headers": "properties"}


def kafka_column(name: str, batch: pa.RecordBatch, partitions: np.ndarray) -> pa.Array:
    """Kafka column ``name`` of a native batch (with the store columns ``KAFKA_NATIVE`` names
    for it: bridge/pruning.py reads only those); ``partitions``: each row's (int32,
    ``partition_of`` its queue)."""
    n = batch.num_rows
    if name == "partition":
        return pa.array(partitions)
    if name == "timestampType":
        return pa.array(np.full(n, LOG_APPEND_TIME, np.int32))
    if name == "key":
        return batch.column("key").cast(pa.binary())
    if name == "headers":
        return _headers(batch.column("properties"))
    return batch.column(KAFKA_NATIVE[name])


def partitions_of(queues: list[str], rows: list[int]) -> np.ndarray:
    """Each row's ``partition``: ``rows[i]`` rows of ``queues[i]`` after one another."""
    return np.repeat(np.array([partition_of(q) for q in queues], np.int32), rows)


def to_kafka(batch: pa.RecordBatch, include_headers: bool) -> pa.RecordBatch:
    """A whole native batch (one queue's rows) as the Kafka source's columns."""
    queue = batch.column("queue")[0].as_py() if batch.num_rows else ""
    schema = _ARROW_WITH_HEADERS if include_headers else _ARROW
    partitions = partitions_of([queue], [batch.num_rows])
    return pa.RecordBatch.from_arrays([kafka_column(name, batch, partitions) for name in schema.names], schema=schema)


def _headers(props: pa.MapArray) -> pa.Array:
    """map<string,string> -> array<struct<key,value:binary>>, null where a message has none."""
    if props.offset:
        props = pa.concat_arrays([props])  # unsliced: offsets from 0 into its own keys and items
    pairs = pa.StructArray.from_arrays([props.keys, props.items.cast(pa.binary())], fields=list(_HEADER_TYPE))
    offsets = props.offsets.to_numpy()
    mask = pa.array(offsets[1:] == offsets[:-1])  # no properties (or null): null, as Kafka's
    return pa.ListArray.from_arrays(props.offsets, pairs, type=_ARROW_WITH_HEADERS.field("headers").type, mask=mask)
