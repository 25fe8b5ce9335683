"""Two streaming queries over the ``tidemq`` source in one driver, each with its own checkpoint
(the shape of a telemetry job: an aggregate and the raw readings), restarted from their
checkpoints: every restart runs, and the outputs stay exact. Spark shares the registered
source's environment map among the queries' tasks, and a query's start writes to it while the
other's tasks are being serialised (``spark_sinks/registration.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path

from spark_sinks import register
from spark_sinks.registration import registered_environment
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway
from tests.spark_support import activate

SITES = ("north", "south", "east")


async def publish(port: int, first: int, count: int) -> None:
    """Readings ``first``.. over MQTT QoS 1, reading i to site ``SITES[i % 3]``, payload ``i``."""
    pub = PahoClient(port, f"devices-{first}")
    await pub.connect()
    for i in range(first, first + count):
        await pub.publish(f"sensors/{SITES[i % len(SITES)]}/d{i % 5}/temp", b"%d" % i, qos=1)
    await pub.disconnect()


class TwoQueryJob:
    """Per-site counts (complete mode, through ``foreachBatch``) and the raw readings to Parquet,
    each from its own checkpoint under ``work``."""

    def __init__(self, spark, address: str, work: Path) -> None:
        self.spark, self.address, self.work = spark, address, work
        self.counts: dict[str, int] = {}

    def keep_counts(self, batch, batch_id: int) -> None:
        self.counts = {r.site: r.n for r in batch.collect()}

    def start(self) -> list:
        from pyspark.sql import functions as F

        activate(self.spark)
        readings = (self.spark.readStream.format("tidemq").option("address", self.address)
                    .option("topicFilter", "sensors/+/+/temp").option("schema", "kafka")
                    .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 40).load()
                    .withColumn("site", F.split("topic", "/").getItem(1)))
        counts = (readings.groupBy("site").agg(F.count(F.lit(1)).alias("n")).writeStream.outputMode("complete")
                  .foreachBatch(self.keep_counts).option("checkpointLocation", str(self.work / "ckpt-counts")).start())
        raw = (readings.select(F.col("value").cast("string").alias("reading"), "partition", "offset").writeStream
               .format("parquet").option("path", str(self.work / "raw"))
               .option("checkpointLocation", str(self.work / "ckpt-raw")).start())
        return [counts, raw]

    def run_until_caught_up(self, queries: list, readings: int) -> None:
        """Until both queries have read ``readings`` readings; fails if one dies."""
        deadline = time.monotonic() + 120
        while sum(self.counts.values()) < readings or self.raw_count() < readings:
            for q in queries:
                assert q.isActive, f"query {q.name or q.id} died: {q.exception()}"
            assert time.monotonic() < deadline, (self.counts, self.raw_count())
            time.sleep(0.2)

    def raw_count(self) -> int:
        path = self.work / "raw" / "_spark_metadata"
        return self.spark.read.parquet(str(self.work / "raw")).count() if path.exists() else 0

    def raw_readings(self) -> list[int]:
        return sorted(int(r.reading) for r in self.spark.read.parquet(str(self.work / "raw")).collect())


def expected_counts(readings: int) -> dict[str, int]:
    return dict(Counter(SITES[i % len(SITES)] for i in range(readings)))


async def test_two_queries_restarted_from_their_checkpoints_run_and_stay_exact(spark, tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "data", metrics_bind="127.0.0.1:0") as gw:
        job = TwoQueryJob(spark, "{}:{}".format(*gw.metrics_address), tmp_path)
        published = 0
        for _ in range(3):  # each a new driver's start: the format registered afresh, both queries from checkpoints
            await publish(mqtt_port(gw), published, 90)
            published += 90
            register(spark)
            queries = await asyncio.to_thread(job.start)
            try:
                await asyncio.to_thread(job.run_until_caught_up, queries, published)
            finally:
                for q in queries:
                    await asyncio.to_thread(q.stop)
        assert job.counts == expected_counts(published)  # nothing counted twice across restarts
        assert await asyncio.to_thread(job.raw_readings) == list(range(published))  # each reading once


async def test_queries_run_while_the_shared_environment_is_written(spark, tmp_path: Path) -> None:
    """What a query's start does to the environment map the other queries' tasks carry, done
    again and again while two queries run micro-batches: none of their tasks may fail."""
    register(spark)
    environment = registered_environment(spark, "tidemq")
    for i in range(2000):  # (a larger map takes longer to serialise: the writes meet it more often)
        environment.put(f"TIDEMQ_TEST_FILLER_{i}", "x" * 16)
    stop = threading.Event()

    def write_entries() -> None:
        while not stop.is_set():
            environment.put("TIDEMQ_TEST_STARTING_QUERY", "1")
            environment.remove("TIDEMQ_TEST_STARTING_QUERY")

    async with running_gateway(tmp_path / "data", metrics_bind="127.0.0.1:0") as gw:
        job = TwoQueryJob(spark, "{}:{}".format(*gw.metrics_address), tmp_path)
        await publish(mqtt_port(gw), 0, 600)  # 15 micro-batches of 40 for each query
        writer = threading.Thread(target=write_entries, daemon=True)
        writer.start()
        queries = await asyncio.to_thread(job.start)
        try:
            await asyncio.to_thread(job.run_until_caught_up, queries, 600)
        finally:
            stop.set()
            writer.join()
            for q in queries:
                await asyncio.to_thread(q.stop)
            register(spark)  # (the next test's registration without the filler)
        assert job.counts == expected_counts(600)
        assert await asyncio.to_thread(job.raw_readings) == list(range(600))
