"""The ``tidemq`` Spark source: messages published over MQTT to a real gateway, read by a local
Spark session (one for the whole run, see conftest) through the gateway's read API
(``address``) or the data directory (``dataDir``): exact batch ranges, topicFilter (the topic
queues of the filter), JSON offsets, admission control, restart from a checkpoint, and data loss
after retention."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.data_client import close_clients
from bridge.spark_options import OptionError, SourceOptions
from bridge.spark_partitions import (
    SHIP_ROWS,
    DataLossError,
    QueueRange,
    QueueRanges,
    joined,
    read_any,
    read_partition,
)
from bridge.spark_source import SCHEMA, rate_limit
from bridge.kafka_options import KafkaOptions
from bridge.kafka_schema import partition_of, spark_schema
from bridge.pruning import projection
from store.read.columns import ARROW_SCHEMA, BATCH_ROWS
from store.read.readonly import StoreReader
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway
from tests.spark_support import num_partitions

FILTER = "devices/+/telemetry"
WILDCARD = "w:devices/+/telemetry"


def topic(i: int) -> str:
    return f"devices/{i % 4}/telemetry"


def payload(i: int) -> bytes:
    return b'{"seq": %d, "temp": %d}' % (i, 20 + i % 7)


async def publish(gw, first: int, count: int, *, size: int = 0) -> None:
    """Messages first..first+count-1 to devices/{i % 4}/telemetry, QoS 1 (stored when acked)."""
    pub = PahoClient(mqtt_port(gw), f"pub-{first}")
    await pub.connect()
    for i in range(first, first + count):
        await pub.publish(topic(i), payload(i) + b" " * size, qos=1)
    await pub.disconnect()


async def subscribe_filter(gw) -> PahoClient:
    """A subscriber of FILTER: from now on the gateway indexes matching messages into WILDCARD too,
    which a topicFilter query does not read (it reads the topic queues: nothing twice)."""
    sub = PahoClient(mqtt_port(gw), "filter-sub")
    await sub.connect()
    await sub.subscribe(FILTER, qos=0)
    return sub


async def flush_index(gw) -> None:
    """What a dataDir reader sees is what the gateway's index has flushed (it does so every
    index_flush_interval_s): flush now instead of waiting."""
    await asyncio.to_thread(gw.store.commitlog.flush)
    await asyncio.to_thread(gw.store.index.flush)


def connection(gw, mode: str) -> dict[str, str]:
    if mode == "address":
        return {"address": "{}:{}".format(*gw.metrics_address)}
    return {"dataDir": str(gw.config.data_dir)}


def spark_gateway(data_dir: Path, **config):
    config.setdefault("metrics_bind", "127.0.0.1:0")
    return running_gateway(data_dir, **config)


# -- without Spark -------------------------------------------------------------------------


def test_spark_schema_is_the_arrow_schema_rows_are_built_with() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_options_are_checked_with_messages_naming_them() -> None:
    ok = SourceOptions.parse({"address": "h:1", "topicFilter": FILTER, "maxOffsetsPerTrigger": "10"})
    assert ok.topic_filters == (FILTER,) and ok.max_offsets_per_trigger == 10 and ok.fail_on_data_loss
    assert SourceOptions.parse({"dataDir": "/d", "queues": '["t:a,b", "t:c"]'}).queues == ("t:a,b", "t:c")
    assert SourceOptions.parse({"dataDir": "/d", "queues": "t:a, t:b"}).queues == ("t:a", "t:b")
    assert ok.connection.retry_timeout_s == 120  # an unreachable gateway is retried for 2 minutes
    assert SourceOptions.parse({"address": "h:1", "queues": "q", "retryTimeoutMs": "0"}).connection.retry_timeout_s == 0
    for bad, words in [
        ({"topicFilter": FILTER}, "exactly one of address"),
        ({"address": "h:1", "dataDir": "/d", "queues": "q"}, "exactly one of address"),
        ({"address": "h:1"}, "exactly one of queues"),
        ({"address": "h:1", "queues": "q", "startingOffsets": "soon"}, "startingOffsets"),
        ({"address": "h:1", "queues": "q", "startingOffsets": '{"q": "x"}'}, "startingOffsets"),
        ({"address": "h:1", "queues": "q", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"address": "h:1", "queues": "q", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"address": "h:1", "queues": "q", "subscribe": "q"}, "subscribe is a Kafka source option"),
        ({"address": "h:1", "queues": "q", "nonsense": "q"}, "unknown option"),
        ({"address": "h:1", "queues": "q", "retryTimeoutMs": "-1"}, "retryTimeoutMs"),
        ({"address": "h:1", "topicFilter": "a/#/b"}, "not an MQTT topic filter"),
    ]:
        with pytest.raises(OptionError, match=words):
            SourceOptions.parse(bad)


def test_rate_limit_shares_offsets_by_backlog() -> None:
    start = {"a": 0, "b": 10, "c": 5}
    latest = {"a": 300, "b": 110, "c": 5}
    limited = rate_limit(start, latest, 100)
    assert sum(limited[q] - start[q] for q in start) == 100
    assert limited == {"a": 75, "b": 35, "c": 5}
    assert rate_limit(start, latest, 1000) == latest
    assert sum(v - start[q] for q, v in rate_limit(start, latest, 1).items()) == 1


def test_the_read_api_needs_no_pyspark() -> None:
    code = ("import sys, gateway.server, gateway.http.data_api, store.read.columns, store.read.readonly; "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


def test_a_worker_reading_freezes_what_it_imported_once() -> None:
    """PySpark's worker daemon collects garbage after each task: a read freezes the objects then
    alive (the imported modules) so those passes skip them (bridge/worker_gc.py), and a later read
    neither freezes again nor counts what is frozen (a walk of every frozen object, task after
    task). In a process of its own: a frozen test process would keep its garbage."""
    code = ("import gc; from pyspark.sql.datasource import InputPartition; "
            "from bridge.spark_partitions import read_any; from bridge.pruning import projection; "
            "from bridge.kafka_options import KafkaOptions; "
            "assert gc.get_freeze_count() == 0; "
            "assert list(read_any(InputPartition(None), projection(None, KafkaOptions()))) == []; "
            "frozen = gc.get_freeze_count(); assert frozen > 10_000, frozen; "
            "count = gc.get_freeze_count; gc.get_freeze_count = None; "  # (a count walks every frozen object)
            "list(read_any(InputPartition(None), projection(None, KafkaOptions()))); "
            "gc.get_freeze_count = count; "
            "assert gc.get_freeze_count() == frozen, 'frozen again'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


async def test_read_api_serves_arrow_and_respects_the_admin_token(data_dir: Path) -> None:
    async with spark_gateway(data_dir, admin_token="s3cret") as gw:
        await publish(gw, 0, 30)
        base = "http://{}:{}".format(*gw.metrics_address)
        queue = "t:devices/1/telemetry"
        auth = {"Authorization": "Bearer s3cret"}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/data/read", params={"queue": queue, "start": 0}) as response:
                assert response.status == 401
            async with http.get(f"{base}/data/read", params={"queue": queue, "start": 2, "end": 6},
                                headers=auth) as response:
                assert response.status == 200
                assert response.content_type == "application/vnd.apache.arrow.stream"
                assert (response.headers["TideMQ-First-Offset"], response.headers["TideMQ-Next-Offset"]) == ("2", "6")
                assert (response.headers["TideMQ-Min-Offset"], response.headers["TideMQ-Max-Offset"]) == ("0", "8")
                table = pa.ipc.open_stream(await response.read()).read_all()
            assert table.schema.equals(ARROW_SCHEMA)
            assert table.column("offset").to_pylist() == [2, 3, 4, 5]
            assert table.column("payload").to_pylist() == [payload(i) for i in (9, 13, 17, 21)]
            assert table.column("topic").to_pylist() == [topic(1)] * 4
            assert dict(table.column("properties")[0].as_py()) == {"mqtt.cid": "pub-0"}
            async with http.post(f"{base}/data/offsets", json={"queues": [queue, "t:nope"]}, headers=auth) as response:
                assert await response.json() == {"offsets": {queue: {"min_offset": 0, "max_offset": 8},
                                                             "t:nope": None}}
            async with http.get(f"{base}/data/read", params={"queue": "t:nope", "start": 0},
                                headers=auth) as response:
                assert response.status == 404


async def test_read_api_serves_several_ranges_in_one_answer(data_dir: Path) -> None:
    """POST /data/read: the ranges in order up to max_rows in all (a prefix served, the last one
    perhaps in part), a queue not in the store as null, the caller's read rights checked; the
    rows in one batch when the client asks for joined batches, else a batch a range."""
    async with spark_gateway(data_dir, admin_token="s3cret") as gw:
        await publish(gw, 0, 40)  # 10 messages on each of the 4 topics
        base = "http://{}:{}".format(*gw.metrics_address)
        auth = {"Authorization": "Bearer s3cret"}
        ranges = [["t:devices/1/telemetry", 2, 5], ["t:nope", 0, 3], ["t:devices/3/telemetry", 0, 10],
                  ["t:devices/0/telemetry", 0, 10]]
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/data/read", json={"ranges": ranges}) as response:
                assert response.status == 401
            async with http.post(f"{base}/data/read", json={"ranges": ranges, "max_rows": 8, "joined": True,
                                                            "columns": ["topic", "offset", "payload"]},
                                 headers=auth) as response:
                assert response.status == 200
                body = await response.read()
            async with http.post(f"{base}/data/read", json={"ranges": ranges, "max_rows": 8, "columns": ["offset"]},
                                 headers=auth) as response:
                assert response.status == 200
                unjoined = await response.read()
            async with http.post(f"{base}/data/read", json={"ranges": "t:a"}, headers=auth) as response:
                assert response.status == 400
        size = int.from_bytes(body[:4], "big")
        assert json.loads(body[4:4 + size]) == {"ranges": [
            {"first": 2, "next": 5, "min": 0, "max": 10, "rows": 3}, None,
            {"first": 0, "next": 5, "min": 0, "max": 10, "rows": 5}]}  # 8 rows in all: devices/0 not served
        batches = list(pa.ipc.open_stream(body[4 + size:]))
        assert len(batches) == 1  # the ranges' rows built together, not a batch a range
        # a client that does not ask for joined batches (one from before them) gets a batch a range
        assert [b.num_rows for b in pa.ipc.open_stream(unjoined[4 + int.from_bytes(unjoined[:4], "big"):])] == [3, 5]
        table = pa.Table.from_batches(batches)
        assert sorted(table.column_names) == ["offset", "payload", "topic"]  # (in the store schema's order)
        assert list(zip(table.column("topic").to_pylist(), table.column("offset").to_pylist())) == [
            (topic(1), 2), (topic(1), 3), (topic(1), 4), *((topic(3), o) for o in range(5))]
        assert table.column("payload").to_pylist()[:3] == [payload(i) for i in (9, 13, 17)]


@pytest.mark.parametrize("mode", ["address", "dataDir"])
async def test_short_ranges_of_a_partition_are_read_together_exactly(data_dir: Path, mode: str) -> None:
    """A partition of many short ranges (QueueRanges) reads them in requests of several ranges,
    fetchRows rows a request: every offset once, in the planned order, lost offsets reported."""
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 40)
        await flush_index(gw)
        conn = SourceOptions.parse({**connection(gw, mode), "queues": "t:a"}).connection
        planned = [("t:devices/2/telemetry", 3, 10), ("t:devices/0/telemetry", 0, 4), ("t:devices/1/telemetry", 5, 6),
                   ("t:devices/3/telemetry", 0, 10)]

        def read(ranges) -> list[tuple[str, int]]:
            parts = QueueRanges([QueueRange(q, s, e, conn, True, fetch_rows=4) for q, s, e in ranges])
            return [(t, o) for batch in read_any(parts, projection(None, KafkaOptions()))
                    for t, o in zip(batch.column("topic").to_pylist(), batch.column("offset").to_pylist())]

        assert await asyncio.to_thread(read, planned) == [
            (q.removeprefix("t:"), o) for q, s, e in planned for o in range(s, e)]
        with pytest.raises(DataLossError, match="t:devices/9/telemetry"):
            await asyncio.to_thread(read, [*planned, ("t:devices/9/telemetry", 0, 2)])
        close_clients()


@pytest.mark.parametrize("mode", ["address", "dataDir"])
async def test_a_request_of_several_ranges_reaches_spark_as_one_batch_of_kafka_rows(data_dir: Path, mode: str) -> None:
    """The ranges a request reads come back as one batch shaped at once: each row with its own
    queue's partition, topic and offset, in the planned order."""
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 40)
        await flush_index(gw)
        opts = SourceOptions.parse({**connection(gw, mode), "topicFilter": "devices/+/telemetry", "schema": "kafka"})
        planned = [("t:devices/2/telemetry", 3, 10), ("t:devices/0/telemetry", 0, 4), ("t:devices/3/telemetry", 9, 10)]
        parts = QueueRanges([QueueRange(q, s, e, opts.connection, True, fetch_rows=100) for q, s, e in planned])
        batches = await asyncio.to_thread(lambda: list(read_any(parts, projection(spark_schema(False), opts.kafka))))
        assert len(batches) == 1
        assert list(zip(*(batches[0].column(c).to_pylist() for c in ("partition", "topic", "offset")))) == [
            (partition_of(q), q.removeprefix("t:"), o) for q, s, e in planned for o in range(s, e)]
        close_clients()


async def test_a_worker_reading_through_the_gateway_loads_no_store_or_gateway_code(data_dir: Path) -> None:
    """Each Python process Spark starts for a query (the stream's planner, the executors'
    workers) imports the source before its first read, in the first micro-batch's time: one
    that reads through the gateway (address) reads rows without importing the store's package
    (its writer, replication, RocksDB index) or the gateway's. In a process of its own, as a
    Spark worker is."""
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 8)
        code = ("import sys; from pyspark.sql.datasource import InputPartition; "
                "from spark_sinks.writer import TideMQDataSource; "
                "from bridge.spark_options import SourceOptions; "
                "from bridge.spark_partitions import QueueRange, read_any; from bridge.pruning import projection; "
                "from bridge.kafka_schema import spark_schema; "
                f"opts = SourceOptions.parse({{'address': '{connection(gw, 'address')['address']}', "
                "'topicFilter': 'devices/+/telemetry', 'schema': 'kafka'}); "
                "part = QueueRange('t:devices/1/telemetry', 0, 2, opts.connection, True, 100); "
                "rows = [v for b in read_any(part, projection(spark_schema(False), opts.kafka)) "
                "for v in b.column('value').to_pylist()]; "
                "print(rows); loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('store', 'gateway')); "
                "assert not loaded, loaded")
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True,
                                       cwd=Path(__file__).resolve().parent.parent)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == repr([payload(1), payload(5)])


async def test_store_reader_reads_while_the_gateway_writes_and_changes_nothing(data_dir: Path) -> None:
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 20)
        await flush_index(gw)
        def files() -> dict[Path, int]:
            return {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()}

        before = files()
        with StoreReader(data_dir) as reader:  # the gateway holds the store's lock meanwhile
            # the only write: rocksdict rewrites its one-line config with the same bytes
            assert [p.name for p, t in files().items() if before.get(p) != t] == ["rocksdict-config.json"]
            assert reader.offsets("t:devices/2/telemetry") == (0, 5)
            await publish(gw, 20, 4)  # not flushed yet: the reader does not offer it
            reader.refresh()
            assert reader.offsets("t:devices/2/telemetry") == (0, 5)
            await flush_index(gw)
            reader.refresh()
            assert reader.offsets("t:devices/2/telemetry") == (0, 6)
        assert (data_dir / "LOCK").read_text().strip() == str(os.getpid())


# -- through Spark ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["address", "dataDir"])
async def test_batch_reads_exact_ranges(spark, data_dir: Path, mode: str) -> None:
    async with spark_gateway(data_dir) as gw:
        sub = await subscribe_filter(gw)
        await publish(gw, 0, 120)
        await flush_index(gw)
        queue = "t:devices/1/telemetry"  # messages 1, 5, 9, ...: offset k holds message 4k + 1

        def read(**options):
            reader = spark.read.format("tidemq").options(**connection(gw, mode))
            return reader.options(**options).load()

        rows = await asyncio.to_thread(lambda: read(
            queues=queue, startingOffsets=json.dumps({queue: 5}), endingOffsets=json.dumps({queue: 17})
        ).orderBy("offset").collect())
        assert [r.offset for r in rows] == list(range(5, 17))
        assert [r.payload for r in rows] == [payload(4 * k + 1) for k in range(5, 17)]
        assert {r.queue for r in rows} == {queue} and {r.topic for r in rows} == {topic(1)}
        assert rows[0].properties == {"mqtt.cid": "pub-0"} and rows[0].key is None

        # topicFilter: every message of the matching topics, from their topic queues (message i
        # is offset i // 4 of topic(i)); 30 a queue: split in two by 25 a partition, two queues
        # to a partition by 70
        expected = sorted((f"t:{topic(i)}", i // 4, topic(i), payload(i)) for i in range(120))
        for per_partition, partitions in (("25", 8), ("70", 2)):
            df = read(topicFilter=FILTER, maxRecordsPerPartition=per_partition)
            assert await asyncio.to_thread(num_partitions, spark, df) == partitions
            rows = await asyncio.to_thread(lambda d=df: d.collect())
            assert sorted((r.queue, r.offset, r.topic, r.payload) for r in rows) == expected
        counts = await asyncio.to_thread(lambda: dict(read(topicFilter=FILTER).groupBy("topic").count().collect()))
        assert counts == {topic(d): 30 for d in range(4)}

        # JSON per queue, -2 = earliest; queues left out of endingOffsets end at latest
        other = "t:devices/3/telemetry"
        rows = await asyncio.to_thread(lambda: read(
            queues=f"{queue},{other}", startingOffsets=json.dumps({queue: -2, other: 28}),
            endingOffsets=json.dumps({queue: 2}),
        ).collect())
        assert sorted((r.queue, r.offset) for r in rows) == [(queue, 0), (queue, 1), (other, 28), (other, 29)]

        with pytest.raises(Exception, match="no queue 't:devices/9/telemetry'"):
            await asyncio.to_thread(lambda: read(queues="t:devices/9/telemetry").collect())
        with pytest.raises(Exception, match="endingOffsets for queue"):
            await asyncio.to_thread(lambda: read(queues=queue, endingOffsets=json.dumps({queue: 99})).collect())
        await sub.disconnect()


async def test_streaming_admission_control_with_max_offsets_per_trigger(spark, data_dir: Path, tmp_path) -> None:
    async with spark_gateway(data_dir) as gw:
        sub = await subscribe_filter(gw)
        await publish(gw, 0, 100)
        sizes: list[int] = []
        offsets: list[tuple[str, int]] = []

        def each(batch, batch_id: int) -> None:
            rows = batch.select("queue", "offset").collect()
            sizes.append(len(rows))
            offsets.extend((r.queue, r.offset) for r in rows)

        def run() -> None:
            query = (spark.readStream.format("tidemq").options(**connection(gw, "address"))
                     .option("topicFilter", FILTER).option("startingOffsets", "earliest")
                     .option("maxOffsetsPerTrigger", 30).load()
                     .writeStream.foreachBatch(each).trigger(availableNow=True)
                     .option("checkpointLocation", str(tmp_path / "ckpt")).start())
            query.awaitTermination(120)
            assert not query.isActive

        await asyncio.to_thread(run)
        assert sizes == [30, 30, 30, 10]
        assert sorted(offsets) == sorted((f"t:{topic(i)}", i // 4) for i in range(100))
        await sub.disconnect()


async def test_streaming_restart_from_checkpoint_loses_and_repeats_nothing(spark, data_dir: Path, tmp_path) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    async with spark_gateway(data_dir) as gw:
        sub = await subscribe_filter(gw)
        await publish(gw, 0, 150)
        await flush_index(gw)

        def start():
            return (spark.readStream.format("tidemq").options(**connection(gw, "dataDir"))
                    .option("topicFilter", FILTER).option("startingOffsets", "earliest")
                    .option("maxOffsetsPerTrigger", 25).load()
                    .select("queue", "offset", "topic", "payload")
                    .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt)))

        def first_run() -> int:
            query = start().trigger(processingTime="0 seconds").start()
            deadline = time.monotonic() + 120
            while len([p for p in query.recentProgress if p["numInputRows"]]) < 2:
                assert time.monotonic() < deadline and query.isActive, query.exception()
                time.sleep(0.05)
            query.stop()  # mid-stream: 150 messages, 25 a batch, stopped after 2 or a few
            return sum(p["numInputRows"] for p in query.recentProgress)

        done = await asyncio.to_thread(first_run)
        assert 50 <= done < 150
        await publish(gw, 150, 50)
        await flush_index(gw)

        def second_run() -> list:
            query = start().trigger(availableNow=True).start()
            query.awaitTermination(120)
            assert query.exception() is None
            return spark.read.parquet(str(out)).collect()

        rows = await asyncio.to_thread(second_run)
        assert sorted((r.queue, r.offset) for r in rows) == sorted((f"t:{topic(i)}", i // 4) for i in range(200))
        assert all(r.payload == payload(4 * r.offset + int(r.topic.split("/")[1])) for r in rows)  # each once
        await sub.disconnect()


async def _after_retention(gw) -> tuple[str, int]:
    """60 messages of ~1 KiB to one topic in 8 KiB segments, then retention keeps ~20 KB: the
    first offsets of the queue are gone. Returns the queue and its first offset still stored."""
    pub = PahoClient(mqtt_port(gw), "big-pub")
    await pub.connect()
    for i in range(60):
        await pub.publish("devices/0/telemetry", payload(i) + b" " * 1000, qos=1)
    await pub.disconnect()
    assert await gw.store.apply_retention() > 0
    queue = "t:devices/0/telemetry"
    low = await gw.store.min_offset(queue)
    assert 10 < low < 55
    await flush_index(gw)
    return queue, low


async def test_fail_on_data_loss_after_retention(spark, data_dir: Path) -> None:
    async with spark_gateway(data_dir, segment_size=8192, retention_bytes=20_000, retention_hours=0) as gw:
        queue, low = await _after_retention(gw)

        def read(fail: str, mode: str):
            return (spark.read.format("tidemq").options(**connection(gw, mode)).option("queues", queue)
                    .option("startingOffsets", json.dumps({queue: 3})).option("failOnDataLoss", fail).load())

        for mode in ("address", "dataDir"):
            with pytest.raises(Exception) as failed:
                await asyncio.to_thread(lambda m=mode: read("true", m).collect())
            assert f"offsets 3..{low - 1} of queue '{queue}' are lost: retention removed them" in str(failed.value)
            assert "failOnDataLoss=false" in str(failed.value)
            rows = await asyncio.to_thread(lambda m=mode: read("false", m).orderBy("offset").collect())
            assert [r.offset for r in rows] == list(range(low, 60))
            assert [r.payload.rstrip() for r in rows] == [payload(i) for i in range(low, 60)]

        # a range retention removed entirely, skipped: an empty batch, not a crash
        rows = await asyncio.to_thread(lambda: spark.read.format("tidemq").options(**connection(gw, "address"))
                                       .option("queues", queue).option("startingOffsets", json.dumps({queue: 3}))
                                       .option("endingOffsets", json.dumps({queue: 5}))
                                       .option("failOnDataLoss", "false").load().collect())
        assert rows == []

        # earliest is the first offset still stored: no loss to report
        rows = await asyncio.to_thread(lambda: spark.read.format("tidemq").options(**connection(gw, "address"))
                                       .option("queues", queue).load().count())
        assert rows == 60 - low


@pytest.mark.parametrize("mode", ["address", "dataDir"])
async def test_executors_detect_data_lost_after_planning(data_dir: Path, caplog, mode: str) -> None:
    """Retention between planning a range (driver) and reading it (executor): the executor's
    read fails, or skips and logs, per failOnDataLoss (read_partition is what executors run)."""
    async with spark_gateway(data_dir, segment_size=8192, retention_bytes=20_000, retention_hours=0) as gw:
        queue, low = await _after_retention(gw)
        conn = SourceOptions.parse({**connection(gw, mode), "queues": queue}).connection

        def read(fail: bool) -> list[int]:
            part = QueueRange(queue, 0, 60, conn, fail, fetch_rows=7)
            return [o for batch in read_partition(part) for o in batch.column("offset").to_pylist()]

        with pytest.raises(DataLossError, match=f"offsets 0..{low - 1} of queue '{queue}' are lost"):
            await asyncio.to_thread(read, True)
        with caplog.at_level(logging.WARNING, logger="tidemq.spark"):
            assert await asyncio.to_thread(read, False) == list(range(low, 60))
        assert f"skipping {low} messages" in caplog.text and "retention removed them" in caplog.text
        close_clients()


async def test_read_api_lists_queues_by_prefix(data_dir: Path) -> None:
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 8)
        base = "http://{}:{}".format(*gw.metrics_address)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/data/queues", params={"prefix": "t:devices/"}) as response:
                assert response.status == 200, await response.text()
                rows = (await response.json())["queues"]
            assert [r["queue"] for r in rows] == [f"t:{topic(d)}" for d in range(4)]
            assert {(r["min_offset"], r["max_offset"]) for r in rows} == {(0, 2)}
            async with http.get(f"{base}/data/queues", params={"prefix": "t:devices/", "limit": "1"}) as response:
                assert [r["queue"] for r in (await response.json())["queues"]] == ["t:devices/0/telemetry"]


@pytest.mark.parametrize("mode", ["address", "dataDir"])
async def test_batch_of_an_empty_range_reads_nothing(spark, data_dir: Path, mode: str) -> None:
    """An incremental batch from saved offsets with nothing new: start == end, no partitions
    (PySpark then plans one placeholder partition that is not ours)."""
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 8)
        await flush_index(gw)
        queue = "t:devices/1/telemetry"
        rows = await asyncio.to_thread(lambda: spark.read.format("tidemq").options(**connection(gw, mode))
                                       .option("queues", queue).option("startingOffsets", json.dumps({queue: 2}))
                                       .load().collect())
        assert rows == []


async def test_starting_offset_past_the_end_is_named_as_such(spark, data_dir: Path, tmp_path) -> None:
    async with spark_gateway(data_dir) as gw:
        await publish(gw, 0, 8)
        queue = "t:devices/1/telemetry"

        def source(reader):
            return (reader.format("tidemq").options(**connection(gw, "address")).option("queues", queue)
                    .option("startingOffsets", json.dumps({queue: 5})))

        with pytest.raises(Exception) as failed:
            await asyncio.to_thread(lambda: source(spark.read).load().collect())
        assert f"startingOffsets for queue '{queue}' is 5, past the queue's end (2" in str(failed.value)

        def stream() -> str:
            query = (source(spark.readStream).load().writeStream.format("noop")
                     .option("checkpointLocation", str(tmp_path / "ckpt")).start())
            try:
                query.awaitTermination(60)
            except Exception as exc:  # noqa: BLE001 - the query's failure is what is checked
                return str(exc)
            query.stop()
            return "the query did not fail"

        text = await asyncio.to_thread(stream)
        assert f"startingOffsets for queue '{queue}' is 5, past the queue's end (2" in text
        assert "replaced or cut" not in text


def test_short_ranges_reach_spark_joined_in_order_and_full_batches_as_they_are() -> None:
    """A partition of many short queue ranges hands Spark few batches (each costs the JVM a
    fixed amount), rows in order; a batch as big as the store's passes without a copy."""
    def batch(first: int, n: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"offset": pa.array(range(first, first + n), pa.int64())})

    full = batch(40_000, SHIP_ROWS)
    parts = [batch(i * 1000, 1000) for i in range(40)] + [full, batch(40_000 + SHIP_ROWS, 5)]
    out = list(joined(iter(parts)))
    assert [b.num_rows for b in out] == [33_000, 7_000 + SHIP_ROWS, 5]
    assert pa.Table.from_batches(out).column("offset").to_pylist() == list(range(40_005 + SHIP_ROWS))
    assert next(joined(iter([full]))) is full
    assert list(joined(iter([]))) == []
    assert SHIP_ROWS == BATCH_ROWS  # the store's full batches are the ones that pass as they are


def test_a_stream_shares_a_micro_batch_of_short_ranges_among_tasks() -> None:
    """Without minPartitions a micro-batch of many short topic ranges is a few tasks of at most
    STREAM_TASK_ROWS rows, about as many rows each (every range once, in order), not one task;
    minPartitions decides when given."""
    from bridge.spark_source import STREAM_TASK_ROWS, TideMQStreamReader

    def planned(extra: dict[str, str]) -> list[list[tuple[str, int, int]]]:
        reader = TideMQStreamReader(SourceOptions.parse({"address": "127.0.0.1:1", "topicFilter": "d/+", **extra}))
        queues = {f"t:d/{i:03d}": (0, 500) for i in range(100)}  # 50,000 rows in 100 ranges
        reader.planner._last = queues
        parts = reader.partitions({q: 0 for q in queues}, {q: 500 for q in queues})
        return [[(r.queue, r.start, r.end) for r in getattr(p, "ranges", [p])] for p in parts]

    tasks = planned({})
    # tasks of equal size: no last task with a remainder, a second wave for one core alone; as
    # few as a batch handed to Spark allows (each task costs Spark a fixed amount)
    assert [sum(e - s for _, s, e in t) for t in tasks] == [25_000] * 2 and 25_000 <= STREAM_TASK_ROWS
    assert [r for t in tasks for r in t] == [(f"t:d/{i:03d}", 0, 500) for i in range(100)]
    assert len(planned({"minPartitions": "4"})) == 4


@given(st.lists(st.integers(1, 40_000), max_size=60), st.integers(1, 8))
def test_shared_ranges_stay_in_order_in_at_most_the_tasks_asked(sizes: list[int], parts: int) -> None:
    """``planning.share``: every range once, in order, in at most ``parts`` non-empty groups,
    none holding more than its share of rows and one range."""
    from bridge.planning import share

    groups = share(sizes, parts)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    assert len(groups) <= parts and all(groups)
    if sizes:
        share_rows = sum(sizes) / parts
        assert all(sum(sizes[i] for i in g) <= share_rows + max(sizes[i] for i in g) for g in groups)
