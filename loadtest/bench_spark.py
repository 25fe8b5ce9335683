"""Spark source benchmark: 1,000,000 stored telemetry messages read by the ``tidemq`` source and
aggregated by a local Spark session (local[2]).

    python -m loadtest.bench_spark [--quick] [--records N] [--modes dataDir,address] [--aggs count,json] [--out FILE]

A gateway (metrics listener on a free 127.0.0.1 port) runs on a fresh temporary data dir; the
messages go straight into its store with ``put_batch`` (each indexed into its device's topic
queue ``t:devices/D/telemetry``, 1,000 devices, and the wildcard queue
``w:devices/+/telemetry``, as the gateway does for a subscribed filter), with an MQTT
publisher's properties and a ~40-byte JSON payload. The Spark job reads the wildcard queue
(``topicFilter``, split into partitions read on both cores) and aggregates per device, two ways:

    agg=count: groupBy(topic).agg(count, sum(length(payload)), max(timestamp))
    agg=json:  the same, plus avg(temp) parsed from the JSON payload (from_json)

once per connection mode: ``dataDir`` (the data dir read directly, while the gateway runs)
and ``address`` (the gateway's /data/ read API over HTTP). One untimed run warms the Python
workers and the JIT, then ``--runs`` (3; ``--quick``: 1) timed runs; the line gives the best::

    spark_source records=1000000 records_per_s=... batch_s=... mode=dataDir agg=count runs=3 partitions=4

``batch_s`` is the wall time of the whole job (planning, offsets, reads, aggregation, collect);
``records_per_s`` is records / batch_s. Spark's session start-up is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

DEVICES = 1000
PUT_BATCH = 20_000


class GatewayThread:
    """A gateway with its own event loop in a background thread (Spark blocks the main one)."""

    def __init__(self, data_dir: Path) -> None:
        from gateway.config import Config
        from gateway.server import Gateway

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gateway = Gateway(Config(data_dir=data_dir, mqtt_bind="", amqp_bind="", remoting_bind="",
                                      metrics_bind="127.0.0.1:0", retention_hours=0))
        self.call(self.gateway.start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.call(self.gateway.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


async def fill(store, records: int) -> None:
    from gateway.mqtt.messages import CLIENT_ID, MQTT_FLAG
    from store import Message, encode_properties

    props = [encode_properties({CLIENT_ID: f"dev-{d}"}) for d in range(DEVICES)]
    topics = [f"devices/{d}/telemetry" for d in range(DEVICES)]
    targets = [[f"t:{t}", "w:devices/+/telemetry"] for t in topics]
    for first in range(0, records, PUT_BATCH):
        batch = []
        for i in range(first, min(records, first + PUT_BATCH)):
            d = i % DEVICES
            body = b'{"seq":%d,"temp":%.1f,"hum":%d}' % (i, 18 + (i * 7 % 100) / 10, 30 + i % 40)
            batch.append((Message(topics[d], body, encoded_properties=props[d], flag=MQTT_FLAG | 1), targets[d]))
        await store.put_batch(batch)


async def flush(store) -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, store.commitlog.flush)
    await loop.run_in_executor(None, store.index.flush)


def start_spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark_sinks import register

    spark = (SparkSession.builder.master("local[2]").appName("tidemq-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def job(spark, options: dict[str, str], agg: str):
    from pyspark.sql import functions as F

    df = spark.read.format("tidemq").options(**options).option("topicFilter", "devices/+/telemetry").load()
    columns = [F.count(F.lit(1)).alias("n"), F.sum(F.length("payload")).alias("bytes"), F.max("timestamp").alias("last")]
    if agg == "json":
        temp = F.from_json(F.col("payload").cast("string"), "temp double, hum int").getField("temp")
        columns.append(F.avg(temp).alias("temp"))
    return df, df.groupBy("topic").agg(*columns)


def measure(spark, options: dict[str, str], agg: str, records: int, runs: int) -> tuple[float, int]:
    df, query = job(spark, options, agg)
    partitions = df.rdd.getNumPartitions()
    rows = query.collect()  # warm-up: Python workers, JIT
    assert len(rows) == min(DEVICES, records) and sum(r.n for r in rows) == records, "wrong aggregate"
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        rows = job(spark, options, agg)[1].collect()
        best = min(best, time.perf_counter() - started)
        assert sum(r.n for r in rows) == records
    return best, partitions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timed run per mode (well under 120 s)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, help="timed runs per mode (default 3, --quick 1)")
    parser.add_argument("--modes", default="dataDir,address")
    parser.add_argument("--aggs", default="count,json", help="count: count, payload bytes and last time per "
                        "device; json: also the average temperature parsed from the JSON payloads")
    parser.add_argument("--out", help="also append the lines to this file")
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-bench-spark-"))
    gw = GatewayThread(tmp / "data")
    lines: list[str] = []
    try:
        t = time.perf_counter()
        gw.call(fill(gw.gateway.store, args.records))
        gw.call(flush(gw.gateway.store))  # what a dataDir reader sees is what the index flushed
        print(f"# stored {args.records} messages in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        spark = start_spark()
        print(f"# spark session in {time.perf_counter() - t:.1f} s", flush=True)
        for mode in args.modes.split(","):
            options = ({"dataDir": str(tmp / "data")} if mode == "dataDir" else
                       {"address": "{}:{}".format(*gw.gateway.metrics_address)})
            for agg in args.aggs.split(","):
                seconds, partitions = measure(spark, options, agg, args.records, runs)
                line = (f"spark_source records={args.records} records_per_s={args.records / seconds:.0f} "
                        f"batch_s={seconds:.2f} mode={mode} agg={agg} runs={runs} partitions={partitions}")
                print(line, flush=True)
                lines.append(line)
        spark.stop()
    finally:
        gw.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        with open(args.out, "a") as out:
            out.writelines(line + "\n" for line in lines)
    print(f"# {time.perf_counter() - started:.0f} s on {os.cpu_count()} cores", flush=True)


if __name__ == "__main__":
    main()
