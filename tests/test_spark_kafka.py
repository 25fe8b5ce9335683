"""The tidemq source as a stand-in for Spark's Kafka source: ``schema=kafka`` (a job written for
the Kafka source's columns runs unchanged), ``born_timestamp``, the timestamp options,
``minOffsetsPerTrigger`` / ``maxTriggerDelay``, offsets behind latest from a query's progress,
the warning for a query that matches nothing, and the Kafka options that are refused."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from pathlib import Path

import pyarrow as pa
import pytest

from bridge.data_client import DirectClient, HttpClient, SourceError, close_clients
from bridge.kafka_options import KAFKA_ONLY
from bridge.kafka_schema import check_partitions, partition_of, to_kafka
from bridge.progress import offsets_behind
from bridge.spark_options import OptionError, SourceOptions
from bridge.spark_source import TideMQBatchReader, TideMQStreamReader
from bridge.trigger_pacing import TriggerPacer
from store import Message
from tests.mqtt_support import PahoClient, mqtt_port
from tests.test_spark_source import connection, flush_index, spark_gateway

TOPIC = "plant/line1/telemetry"
QUEUE = "t:" + TOPIC


async def publish(gw, first: int, count: int, topic: str = TOPIC) -> None:
    pub = PahoClient(mqtt_port(gw), f"pub-{first}")
    await pub.connect()
    for i in range(first, first + count):
        await pub.publish(topic, b"m%d" % i, qos=1)
    await pub.disconnect()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- without Spark -------------------------------------------------------------------------


def test_kafka_options_are_parsed_and_checked_naming_the_option() -> None:
    base = {"address": "h:1", "queues": QUEUE}
    opts = SourceOptions.parse({**base, "schema": "kafka", "includeHeaders": "true", "startingTimestamp": "1000",
                                "minOffsetsPerTrigger": "5", "maxTriggerDelay": "30s"}).kafka
    assert (opts.schema, opts.include_headers, opts.starting_timestamp) == ("kafka", True, 1000)
    assert (opts.min_offsets_per_trigger, opts.max_trigger_delay_s) == (5, 30.0)
    assert SourceOptions.parse({**base, "minOffsetsPerTrigger": "5"}).kafka.max_trigger_delay_s == 900  # 15m
    assert SourceOptions.parse({**base, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "250"}
                               ).kafka.max_trigger_delay_s == 0.25  # a bare number is ms, as Spark reads it
    by = SourceOptions.parse({**base, "startingOffsetsByTimestamp": json.dumps({QUEUE: 7}),
                              "startingOffsetsByTimestampStrategy": "latest"}).kafka
    assert (by.starting_by_timestamp, by.strategy) == ({QUEUE: 7}, "latest")
    for bad, words in [
        ({"schema": "avro"}, "schema must be native or kafka"),
        ({"includeHeaders": "true"}, "includeHeaders is for schema=kafka"),
        ({"schema": "kafka", "includeHeaders": "yes"}, "includeHeaders must be true or false"),
        ({"startingTimestamp": "1", "startingOffsets": "earliest"}, "give one of startingOffsets"),
        ({"startingTimestamp": "1", "startingOffsetsByTimestamp": "{}"}, "give one of startingOffsets"),
        ({"endingTimestamp": "1", "endingOffsets": "latest"}, "give one of endingOffsets"),
        ({"startingTimestamp": "soon"}, "startingTimestamp must be ms since the epoch"),
        ({"endingTimestamp": "-5"}, "endingTimestamp must not be negative"),
        ({"startingOffsetsByTimestamp": '{"q": "x"}'}, "startingOffsetsByTimestamp must be JSON"),
        ({"endingOffsetsByTimestamp": "[1]"}, "endingOffsetsByTimestamp must be JSON"),
        ({"startingTimestamp": "1", "startingOffsetsByTimestampStrategy": "skip"}, "must be error or latest"),
        ({"startingOffsetsByTimestampStrategy": "latest"}, "applies only with startingTimestamp"),
        ({"maxTriggerDelay": "1m"}, "maxTriggerDelay applies only with minOffsetsPerTrigger"),
        ({"minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"}, "maxTriggerDelay must be a duration"),
        ({"minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger must be at least 1"),
        ({"minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"}, "minOffsetsPerTrigger \\(50\\) is more"),
    ]:
        with pytest.raises(OptionError, match=words):
            SourceOptions.parse({**base, **bad})
    # options for one kind of query only are refused by the other, never ignored
    with pytest.raises(OptionError, match="endingTimestamp and endingOffsetsByTimestamp are for batch"):
        TideMQStreamReader(SourceOptions.parse({**base, "endingTimestamp": "5"}))
    with pytest.raises(OptionError, match="minOffsetsPerTrigger and maxTriggerDelay are for streaming"):
        TideMQBatchReader(SourceOptions.parse({**base, "minOffsetsPerTrigger": "5"}))
    with pytest.raises(OptionError, match="maxOffsetsPerTrigger is for streaming queries only"):
        TideMQBatchReader(SourceOptions.parse({**base, "maxOffsetsPerTrigger": "5"}))


@pytest.mark.parametrize("option", [*KAFKA_ONLY, "kafka.bootstrap.servers", "kafka.group.id"])
def test_kafka_options_the_source_cannot_honour_are_refused_by_name(option: str) -> None:
    with pytest.raises(OptionError, match=f"{option} is a Kafka source option the tidemq source does not support"):
        SourceOptions.parse({"address": "h:1", "queues": QUEUE, option: "x"})


def test_queues_whose_partition_numbers_collide_fail_the_plan() -> None:
    seen: dict[int, str] = {}
    for i in range(1_000_000):  # a birthday search: some 2**16 random names for a 31-bit collision
        name = f"t:devices/{hashlib.sha1(b'%d' % i).hexdigest()[:12]}"
        other = seen.setdefault(partition_of(name), name)
        if other != name:
            break
    assert other != name
    check_partitions([other, "t:a"])  # no collision: no error
    with pytest.raises(OptionError, match="queues '.*' and '.*' have the same partition number"):
        check_partitions([name, "t:a", other])


def test_trigger_pacer_follows_the_kafka_source() -> None:
    clock = [100.0]
    pacer = TriggerPacer(10, 60.0, clock=lambda: clock[0])
    assert pacer.admit(3)  # the first trigger is never delayed
    clock[0] += 1
    assert not pacer.admit(9)  # fewer than the minimum, within maxTriggerDelay: skipped
    assert pacer.admit(10)  # the minimum
    clock[0] += 59.9
    assert not pacer.admit(1)
    clock[0] += 0.1
    assert pacer.admit(1)  # maxTriggerDelay since the last batch: whatever there is
    assert not pacer.admit(0)


def test_offsets_behind_from_a_progress_entry() -> None:
    source = {"description": "PythonMicroBatchStreamWithTriggerAvailableNow@1", "startOffset": {"a": 0, "b": 0},
              "endOffset": json.dumps({"a": 5, "b": 2}), "latestOffset": json.dumps({"a": 9, "b": 2, "c": 4})}
    assert offsets_behind(source) == {"total": 8, "queues": {"a": 4, "b": 0, "c": 4}, "minOffsetsBehindLatest": 0,
                                      "maxOffsetsBehindLatest": 4, "avgOffsetsBehindLatest": 8 / 3}
    assert offsets_behind({"endOffset": None, "latestOffset": None}) == {}


async def test_born_timestamp_is_the_producers_time_where_there_is_one(open_store, data_dir: Path) -> None:
    store = await open_store()
    await store.put_batch([(Message("a/b", b"x", born_timestamp=1_700_000_000_123), ["t:a/b"]),
                           (Message("a/b", b"y"), ["t:a/b"])])
    await store.close()
    client = DirectClient(str(data_dir))
    try:
        rows = pa.Table.from_batches(client.read("t:a/b", 0, 2, 10).batches).to_pylist()
    finally:
        client.close()
    assert rows[0]["born_timestamp"].timestamp() == 1_700_000_000.123
    # no producer's time (MQTT, AMQP): the time the gateway took the message, at most the store time
    assert abs((rows[1]["timestamp"] - rows[1]["born_timestamp"]).total_seconds()) < 1
    assert rows[1]["born_timestamp"] <= rows[1]["timestamp"]


def test_kafka_rows_from_native_rows() -> None:
    from store.read.columns import ARROW_SCHEMA

    stamp = pa.array([1_000_000, 2_000_000], pa.timestamp("us", tz="UTC"))
    native = pa.RecordBatch.from_arrays([
        pa.array(["t:q", "t:q"]), pa.array([4, 5], pa.int64()), pa.array(["q", "q"]), pa.array(["k1", None]),
        pa.array([[("mqtt.cid", "c"), ("unit", "C")], []], pa.map_(pa.string(), pa.string())),
        pa.array([b"v4", b"v5"]), stamp, stamp,
    ], schema=ARROW_SCHEMA)
    rows = pa.Table.from_batches([to_kafka(native, True)]).to_pylist()
    assert [(r["key"], r["value"], r["topic"], r["partition"], r["offset"], r["timestampType"]) for r in rows] == [
        (b"k1", b"v4", "q", partition_of("t:q"), 4, 1), (None, b"v5", "q", partition_of("t:q"), 5, 1)]
    assert rows[0]["headers"] == [{"key": "mqtt.cid", "value": b"c"}, {"key": "unit", "value": b"C"}]
    assert rows[1]["headers"] is None  # no properties: null, as Kafka's
    assert "headers" not in to_kafka(native, False).schema.names


async def test_a_query_that_matches_nothing_yet_warns_once(data_dir: Path, caplog) -> None:
    async with spark_gateway(data_dir) as gw:
        reader = TideMQStreamReader(SourceOptions.parse({**connection(gw, "address"), "topicFilter": "nobody/+/x"}))
        try:
            with caplog.at_level(logging.WARNING, logger="tidemq.spark"):
                start = await asyncio.to_thread(reader.initialOffset)
                for _ in range(3):
                    assert await asyncio.to_thread(reader.latestOffset, start, reader.getDefaultReadLimit()) == start
            warnings = [r.getMessage() for r in caplog.records if "matches no stored message" in r.getMessage()]
            assert len(warnings) == 1 and "topicFilter 'nobody/+/x'" in warnings[0], warnings
        finally:
            reader.stop()
            close_clients()


async def test_a_stream_starts_where_its_first_initial_offset_said(data_dir: Path) -> None:
    """Spark asks a new query's initial offsets twice in its first micro-batch (for latestOffset,
    then to plan the batch): ``latest`` must be one moment, not two listings apart, or the
    messages stored between them would be in neither batch."""
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 3)
        reader = TideMQStreamReader(SourceOptions.parse({**connection(gw, "address"), "topicFilter": "plant/+/telemetry",
                                                         "startingOffsets": "latest"}))
        try:
            start = await asyncio.to_thread(reader.initialOffset)
            assert start == {QUEUE: 3}
            await publish(gw, 3, 2)
            assert await asyncio.to_thread(reader.initialOffset) == start
            latest = await asyncio.to_thread(reader.latestOffset, start, reader.getDefaultReadLimit())
            assert latest == {QUEUE: 5}
            parts = await asyncio.to_thread(reader.partitions, await asyncio.to_thread(reader.initialOffset), latest)
            assert [(p.queue, p.start, p.end) for p in parts] == [(QUEUE, 3, 5)]
        finally:
            reader.stop()
            close_clients()


@pytest.mark.parametrize("mode", ["address", "dataDir"])
async def test_offsets_for_times_through_both_clients(data_dir: Path, mode: str) -> None:
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 5)
        await asyncio.sleep(0.05)
        middle = now_ms()
        await asyncio.sleep(0.05)
        await publish(gw, 5, 5)
        await flush_index(gw)
        conn = SourceOptions.parse({**connection(gw, mode), "queues": QUEUE}).connection
        client = HttpClient.of(conn) if mode == "address" else DirectClient(str(data_dir))
        try:
            found = await asyncio.to_thread(client.offsets_for_times, {QUEUE: middle, "t:nope": 0})
            assert found == {QUEUE: 5, "t:nope": None}
            assert await asyncio.to_thread(client.offsets_for_times, {QUEUE: 0}) == {QUEUE: 0}
            assert await asyncio.to_thread(client.offsets_for_times, {QUEUE: now_ms() + 60_000}) == {QUEUE: None}
            if mode == "address":  # bad input: a clear 400, not a crash
                for body in ({"queues": {QUEUE: "soon"}}, {"queues": [QUEUE]}, {"times": {}}):
                    with pytest.raises(SourceError, match="answered 400.*send"):
                        await asyncio.to_thread(client._json, "POST", "/data/times", body)
        finally:
            client.close()


# -- through Spark ---------------------------------------------------------------------------

# Spark's Kafka source's schema, as its documentation gives it (written out here, not taken from
# the code under test)
KAFKA_COLUMNS = [("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
                 ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int")]


async def test_a_kafka_job_runs_unchanged_on_schema_kafka(spark, data_dir: Path, tmp_path) -> None:
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 12)
        await publish(gw, 100, 3, topic="plant/line2/telemetry")
        options = {**connection(gw, "address"), "queues": f"{QUEUE},t:plant/line2/telemetry", "schema": "kafka"}

        def kafka_job(reader):
            """What a job written for format("kafka") selects."""
            df = reader.format("tidemq").options(**options).load()
            return df, df.selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "topic", "partition",
                                     "offset", "timestamp", "timestampType")

        df, job = kafka_job(spark.read)
        assert df.dtypes == KAFKA_COLUMNS
        assert all(f.nullable for f in df.schema.fields)
        rows = await asyncio.to_thread(lambda: job.orderBy("topic", "offset").collect())
        assert [(r.v, r.topic, r.offset) for r in rows] == [
            *((f"m{i}", TOPIC, i) for i in range(12)), *((f"m{100 + i}", "plant/line2/telemetry", i) for i in range(3))]
        assert {r.partition for r in rows[:12]} == {partition_of(QUEUE)}
        assert {r.partition for r in rows[12:]} == {partition_of("t:plant/line2/telemetry")} != {partition_of(QUEUE)}
        assert {r.timestampType for r in rows} == {1} and {r.k for r in rows} == {None}
        assert all(r.timestamp is not None for r in rows)

        headers = await asyncio.to_thread(lambda: spark.read.format("tidemq").options(**options)
                                          .option("includeHeaders", "true").load()
                                          .selectExpr("headers", "offset").where("offset = 0").collect())
        assert {tuple((h.key, bytes(h.value)) for h in r.headers) for r in headers} == {
            (("mqtt.cid", b"pub-0"),), (("mqtt.cid", b"pub-100"),)}

        # the same job as a stream, with a window on the Kafka timestamp
        def stream() -> list:
            # (AvailableNow reads up to its target whatever minOffsetsPerTrigger says)
            _, job = kafka_job(spark.readStream.option("startingOffsets", "earliest")
                               .option("maxOffsetsPerTrigger", 4).option("minOffsetsPerTrigger", 4))  # 4, 4, 4, 3
            out = []
            query = (job.groupBy("topic").count().writeStream.outputMode("complete")
                     .foreachBatch(lambda batch, _: out.extend(batch.collect())).trigger(availableNow=True)
                     .option("checkpointLocation", str(tmp_path / "ckpt")).start())
            query.awaitTermination(120)
            assert query.exception() is None
            return out

        counts = {r.topic: r["count"] for r in await asyncio.to_thread(stream)}
        assert counts == {TOPIC: 12, "plant/line2/telemetry": 3}


async def test_timestamp_options_start_and_end_by_store_time(spark, data_dir: Path, tmp_path) -> None:
    async with spark_gateway(data_dir) as gw:
        marks = []
        for burst in range(3):  # m0-m3, then m4-m7, then m8-m11, with a time mark between bursts
            await publish(gw, burst * 4, 4)
            await asyncio.sleep(0.05)
            marks.append(now_ms())
            await asyncio.sleep(0.05)
        base = {**connection(gw, "address"), "queues": QUEUE}

        def read(**options) -> list[int]:
            df = spark.read.format("tidemq").options(**base).options(**options).load()
            return sorted(r.offset for r in df.select("offset").collect())

        assert await asyncio.to_thread(read, startingTimestamp=str(marks[0]), endingTimestamp=str(marks[1])) == [
            4, 5, 6, 7]
        assert await asyncio.to_thread(read, startingOffsetsByTimestamp=json.dumps({QUEUE: marks[1]})) == [
            8, 9, 10, 11]
        assert await asyncio.to_thread(read, endingOffsetsByTimestamp=json.dumps({QUEUE: marks[0]})) == [0, 1, 2, 3]
        # no offset at or after an ending time: latest
        assert await asyncio.to_thread(read, endingTimestamp=str(marks[2] + 60_000)) == list(range(12))
        # none at or after a starting time: an error naming the queue, or latest with the strategy
        with pytest.raises(Exception, match=f"no message of queue '{QUEUE}' was stored at or after startingTimestamp"):
            await asyncio.to_thread(read, startingTimestamp=str(marks[2]))
        assert await asyncio.to_thread(read, startingTimestamp=str(marks[2]),
                                       startingOffsetsByTimestampStrategy="latest") == []

        def stream(**options) -> list[int]:
            out: list[int] = []
            query = (spark.readStream.format("tidemq").options(**base).options(**options).load()
                     .writeStream.foreachBatch(lambda batch, _: out.extend(r.offset for r in batch.collect()))
                     .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ckpt")).start())
            query.awaitTermination(120)
            assert query.exception() is None
            return sorted(out)

        assert await asyncio.to_thread(stream, startingTimestamp=str(marks[0])) == list(range(4, 12))


async def test_min_offsets_per_trigger_waits_and_progress_shows_offsets_behind(spark, data_dir: Path,
                                                                               tmp_path) -> None:
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 25)
        sizes: list[int] = []

        def each(batch, _: int) -> None:
            sizes.append(batch.count())

        query = await asyncio.to_thread(lambda: (
            spark.readStream.format("tidemq").options(**connection(gw, "address")).option("queues", QUEUE)
            .option("startingOffsets", "earliest").option("minOffsetsPerTrigger", 10)
            .option("maxOffsetsPerTrigger", 12).option("maxTriggerDelay", "10m").load()
            .writeStream.foreachBatch(each).trigger(processingTime="100 milliseconds")
            .option("checkpointLocation", str(tmp_path / "ckpt")).start()))
        try:
            async def batches(count: int) -> None:
                for _ in range(1200):  # bounded: up to 120 s on a loaded machine
                    if len(sizes) >= count or not query.isActive:
                        break
                    await asyncio.sleep(0.1)
                assert len(sizes) >= count, (sizes, query.exception())

            # 25: 12 (the first trigger is never delayed), 12, then 1 left waits for 9 more
            async def progress(batch_id: int) -> dict:
                """The progress of batch ``batch_id`` (recorded a little after foreachBatch ran)."""
                for _ in range(600):
                    found = [p for p in query.recentProgress if p["batchId"] == batch_id and p["numInputRows"]]
                    if found:
                        return found[-1]["sources"][0]
                    await asyncio.sleep(0.1)
                raise AssertionError(f"no progress of batch {batch_id}: {query.recentProgress}")

            await batches(2)
            assert offsets_behind(await progress(1))["queues"] == {QUEUE: 1}
            await asyncio.sleep(1.0)  # (ten more triggers, none of which may run a batch)
            assert sizes == [12, 12]
            await publish(gw, 25, 9)  # 1 + 9: the minimum, whatever a trigger sees in between
            await batches(3)
            assert sizes == [12, 12, 10]
            assert offsets_behind(await progress(2))["total"] == 0
        finally:
            await asyncio.to_thread(query.stop)
