"""Only what the query needs: column pruning by the query's schema (``bridge/pruning.py``) and
filter pushdown for batch reads (``bridge/pushdown.py``), against a real gateway fed over MQTT,
read by the local Spark session through the gateway's read API (in this process, so the test
sees what the store was asked to build) and through the data directory."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from bridge.data_client import DirectClient, HttpClient, SourceError
from bridge.kafka_options import KafkaOptions
from bridge.pruning import projection
from bridge.spark_options import OptionError
from bridge.spark_partitions import QueueRange, read_partition
from store.read import columns
from tests.spark_support import num_partitions
from tests.test_spark_source import (
    FILTER,
    connection,
    flush_index,
    payload,
    publish,
    spark_gateway,
    subscribe_filter,
    topic,
)

QUEUE = "t:devices/1/telemetry"


@pytest.fixture
def built(monkeypatch) -> list[tuple[tuple[str, ...], int]]:
    """(columns, rows) of every range the store reads, here or in the gateway."""
    seen: list[tuple[tuple[str, ...], int]] = []
    real = columns.read_ranges  # (every read goes through it, one range or several)

    def read_ranges(db, log, ranges, min_position, schema=columns.ARROW_SCHEMA):
        ranges = list(ranges)
        seen.extend((tuple(schema.names), stop - start) for _, _, start, stop, _ in ranges)
        return real(db, log, ranges, min_position, schema)

    monkeypatch.setattr(columns, "read_ranges", read_ranges)
    return seen


@pytest.fixture
def no_properties(monkeypatch) -> None:
    """Decoding a property block fails the read: a read that asks for no properties decodes none."""
    def decode(blocks):
        raise AssertionError("property blocks decoded")

    monkeypatch.setattr(columns, "_properties", decode)


def test_a_query_schema_must_be_a_subset_of_the_source_columns() -> None:
    native, kafka = KafkaOptions(), KafkaOptions(schema="kafka")
    cols = projection(StructType([StructField("payload", columns_type("payload")), StructField("topic", StringType())]),
                      native)
    assert cols.names == ("payload", "topic") and cols.fetch == ("topic", "payload")
    assert projection(None, native).fetch is None  # the whole schema: everything
    assert projection(StructType([StructField("partition", IntegerType())]), kafka).fetch == ("offset",)
    for schema, options, words in [
        (StructType([StructField("value", StringType())]), native, "'value', which is not a column"),
        (StructType([StructField("Topic", StringType())]), native, "'Topic'"),
        (StructType([StructField("topic", IntegerType())]), native, "'topic' of the query's schema is int"),
        (StructType([StructField("key", StringType(), False)]), native, "'key' of the query's schema is NOT NULL"),
        (StructType([StructField("payload", columns_type("payload"))]), kafka, "'payload'"),
        (StructType([StructField("headers", StringType())]), kafka, "includeHeaders=true"),
    ]:
        with pytest.raises(OptionError, match=words):
            projection(schema, options)


def columns_type(name: str):
    from bridge.pruning import SCHEMA

    return SCHEMA[name].dataType


async def test_clients_fetch_only_the_requested_columns(data_dir: Path, built, no_properties) -> None:
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 40)
        await flush_index(gw)
        http = HttpClient("http://{}:{}".format(*gw.metrics_address))
        direct = DirectClient(str(data_dir))
        try:
            for client in (http, direct):
                fetch = await asyncio.to_thread(client.read, QUEUE, 2, 6, 100, ("topic", "payload"))
                assert [b.schema.names for b in fetch.batches] == [["topic", "payload"]]
                assert fetch.batches[0].column("payload").to_pylist() == [payload(4 * k + 1) for k in range(2, 6)]
                # offsets and times come from the index alone
                fetch = await asyncio.to_thread(client.read, QUEUE, 0, 10, 100, ("offset", "timestamp"))
                assert fetch.batches[0].schema.names == ["offset", "timestamp"]
            assert sorted(built) == [(("offset", "timestamp"), 10)] * 2 + [(("topic", "payload"), 4)] * 2
            with pytest.raises(SourceError, match="bad columns: no column 'nope'"):
                await asyncio.to_thread(http.read, QUEUE, 0, 10, 100, ("topic", "nope"))
            # an executor's read of a kafka-schema subset: partition and offset, from the offsets alone
            part = QueueRange(QUEUE, 0, 10, direct_connection(data_dir), True, fetch_rows=4)
            cols = projection(StructType([StructField("partition", IntegerType()), StructField("offset", columns_type("offset"))]),
                              KafkaOptions(schema="kafka"))
            batches = await asyncio.to_thread(lambda: list(read_partition(part, cols)))
            assert [b.schema.names for b in batches] == [["partition", "offset"]] * 3
            assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(10))
        finally:
            http.close()
            direct.close()


def direct_connection(data_dir: Path):
    from bridge.spark_options import Connection

    return Connection(data_dir=str(data_dir))


async def test_spark_reads_only_the_columns_of_its_schema(spark, data_dir: Path, built, no_properties) -> None:
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 80)
        await flush_index(gw)
        source = connection(gw, "address")

        def count(ddl: str, **options) -> dict:
            df = (spark.read.format("tidemq").schema(ddl).options(**source).option("topicFilter", FILTER)
                  .options(**options).load())
            return dict(df.groupBy("topic").count().collect())

        assert await asyncio.to_thread(count, "topic STRING") == {topic(d): 20 for d in range(4)}
        assert built and {names for names, _ in built} == {("topic",)}
        assert sum(rows for _, rows in built) == 80
        built.clear()
        assert await asyncio.to_thread(count, "value BINARY, topic STRING", schema="kafka") == {
            topic(d): 20 for d in range(4)}
        assert {names for names, _ in built} == {("topic", "payload")}
        # a stream takes the schema too (Trigger.AvailableNow: what is there, then stop)
        built.clear()
        seen: list[str] = []

        def stream() -> None:
            query = (spark.readStream.format("tidemq").schema("offset BIGINT, topic STRING").options(**source)
                     .option("topicFilter", FILTER).option("startingOffsets", "earliest").load()
                     .writeStream.foreachBatch(lambda b, _: seen.extend(r.topic for r in b.collect()))
                     .trigger(availableNow=True).option("checkpointLocation", str(data_dir.parent / "ckpt")).start())
            query.awaitTermination(120)

        await asyncio.to_thread(stream)
        assert sorted(seen) == sorted(topic(i) for i in range(80))
        assert {names for names, _ in built} == {("offset", "topic")}
        for ddl, words in [("topic INT", "column 'topic' of the query's schema is int"),
                              ("topic STRING, temp DOUBLE", "column 'temp', which is not a column")]:
            with pytest.raises(Exception, match=words):
                await asyncio.to_thread(count, ddl)


async def test_topic_and_time_predicates_narrow_the_plan(spark, data_dir: Path, built) -> None:
    async with spark_gateway(data_dir) as gw:
        sub = await subscribe_filter(gw)  # (the wildcard queue holds every message too)
        await publish(gw, 0, 80)
        await asyncio.sleep(0.05)
        cut = datetime.datetime.now(datetime.UTC)
        await asyncio.sleep(0.05)
        await publish(gw, 80, 40)
        await flush_index(gw)

        def read(where, **options):
            df = (spark.read.format("tidemq").options(**connection(gw, "address")).option("maxRecordsPerPartition", 25)
                  .options(**options).load().where(where))
            return num_partitions(spark, df), sorted((r.topic, r.offset) for r in df.collect())

        everything = sorted((topic(i), i // 4) for i in range(120))
        assert (await asyncio.to_thread(read, F.lit(True), topicFilter=FILTER))[0] == 8  # 30 a queue, 2 partitions each
        for where in (F.col("topic") == topic(1), F.col("topic").isin(topic(1), "elsewhere"),
                      F.col("topic").startswith("devices/1/")):
            built.clear()
            parts, rows = await asyncio.to_thread(read, where, topicFilter=FILTER)
            assert (parts, rows) == (2, [r for r in everything if r[0] == topic(1)])
            assert sum(n for _, n in built) == 30  # one queue read, no other
        built.clear()
        parts, rows = await asyncio.to_thread(read, F.col("timestamp") >= F.lit(cut), topicFilter=FILTER)
        assert rows == sorted((topic(i), i // 4) for i in range(80, 120)) and parts == 2  # 4 x 10 rows
        assert sum(n for _, n in built) == 40  # only the messages stored after the cut
        built.clear()
        parts, rows = await asyncio.to_thread(read, (F.col("timestamp") < F.lit(cut)) & (F.col("topic") == topic(2)),
                                              topicFilter=FILTER, schema="kafka")
        assert rows == sorted((topic(2), i // 4) for i in range(2, 80, 4)) and sum(n for _, n in built) == 20
        # a wildcard queue holds many topics: it is read, and the predicate goes back to Spark
        built.clear()
        parts, rows = await asyncio.to_thread(read, F.col("topic") == topic(3), queues=f"w:{FILTER},{QUEUE}")
        assert [t for t, _ in rows] == [topic(3)] * 30 and sum(n for _, n in built) == 120  # not QUEUE's 30
        await sub.disconnect()
