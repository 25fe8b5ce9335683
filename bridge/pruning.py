"""Column pruning for the ``tidemq`` source: a query ships only the columns it asks for.

PySpark's Python data source API has no pruning hook (``DataSourceReader`` gets no list of the
columns a query uses, unlike the JVM's ``SupportsPushDownRequiredColumns``), so a query says
what it needs with a schema of its own, which Spark hands to ``reader(schema)`` /
``streamReader(schema)`` instead of calling ``DataSource.schema()``::

    spark.read.format("tidemq").schema("topic STRING, timestamp TIMESTAMP").option(...).load()

Any subset of the source's columns (native, or ``schema=kafka``'s), in any order, with the
source's names (case-sensitive) and types, is accepted; any other field is refused with an
``OptionError`` naming it (never a column of nulls nobody asked for). Only the store columns
behind the chosen ones are read (``store.read.columns.read_range`` builds nothing else; over HTTP the
``columns`` parameter of ``/data/read``), so a count by topic never decodes payloads or
property blocks, and one over offsets and times never reads the commitlog.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .kafka_options import KafkaOptions
from .kafka_schema import KAFKA_NATIVE, kafka_column, partitions_of, spark_schema
from .spark_options import OptionError

# store.columns.ARROW_SCHEMA as Spark sees it (tests check that the two agree)
SCHEMA = StructType([
    StructField("queue", StringType(), False),
    StructField("offset", LongType(), False),
    StructField("topic", StringType(), False),
    StructField("key", StringType(), True),
    StructField("properties", MapType(StringType(), StringType(), True), True),
    StructField("payload", BinaryType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("born_timestamp", TimestampType(), False),
])


@dataclass(frozen=True, slots=True)
class Projection:
    """The columns a query reads: ``names`` in its order, from store columns ``fetch`` (None:
    all of them). Picklable: it travels with the reader to the executors."""

    names: tuple[str, ...]
    fetch: tuple[str, ...] | None
    kafka: bool
    arrow: pa.Schema

    def shape(self, pieces: list[tuple[pa.RecordBatch, str]]) -> pa.RecordBatch:
        """Batches of the store columns ``fetch`` (each with its queue), in order, as one batch
        of the query's rows."""
        batch = pieces[0][0] if len(pieces) == 1 else pa.concat_batches([b for b, _ in pieces])
        if self.kafka:
            partitions = partitions_of([q for _, q in pieces], [b.num_rows for b, _ in pieces])
            columns = [kafka_column(name, batch, partitions) for name in self.names]
        else:
            columns = [batch.column(name) for name in self.names]
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow)


def source_schema(kafka: KafkaOptions) -> StructType:
    """The source's full schema for these options (``DataSource.schema()``)."""
    return spark_schema(kafka.include_headers) if kafka.schema == "kafka" else SCHEMA


def projection(schema: StructType | None, kafka: KafkaOptions) -> Projection:
    """What a query with ``schema`` (the user's, or None / the full one) reads; a field that is
    not one of the source's columns, or has another type, is an OptionError naming it."""
    full = source_schema(kafka)
    schema = full if schema is None else schema
    which = "schema=kafka" if kafka.schema == "kafka" else "the native schema"
    known = {f.name: f for f in full.fields}
    seen: set[str] = set()
    for f in schema.fields:
        ours = known.get(f.name)
        if ours is None:
            raise OptionError(
                f"tidemq source: the query's schema has column {f.name!r}, which is not a column of {which} "
                f"(names are case-sensitive): give a subset of {', '.join(known)}"
                + ("; headers needs includeHeaders=true" if f.name == "headers" else ""))
        if f.dataType != ours.dataType:
            raise OptionError(f"tidemq source: column {f.name!r} of the query's schema is "
                              f"{f.dataType.simpleString()}, but the source gives {ours.dataType.simpleString()}")
        if not f.nullable and ours.nullable:
            raise OptionError(f"tidemq source: column {f.name!r} of the query's schema is NOT NULL, but the "
                              "source gives nulls in it")
        if f.name in seen:
            raise OptionError(f"tidemq source: the query's schema has column {f.name!r} twice")
        seen.add(f.name)
    names = tuple(schema.fieldNames())
    if kafka.schema == "kafka":
        needed = {KAFKA_NATIVE[name] for name in names} - {None}
    else:
        needed = set(names)
    fetch: tuple[str, ...] | None = tuple(f.name for f in SCHEMA.fields if f.name in needed)
    if not fetch:
        fetch = ("offset",)  # (partition, timestampType: constants per batch, which still needs its rows)
    if len(fetch) == len(SCHEMA.fields):
        fetch = None
    return Projection(names, fetch, kafka.schema == "kafka", to_arrow_schema(schema, timezone="UTC"))
