"""The telemetry job of the Spark streaming loadtests, as a Kafka-source user writes it: devices
publish JSON readings to ``sensors/{site}/{device}/temp``; a streaming query reads
``sensors/+/+/temp`` with ``schema=kafka``, parses the value with ``from_json`` and averages the
temperature per site per 1-minute event-time window under a watermark.

The readings go straight into a gateway's store (``put_batch``, each into its topic queue, as an
MQTT PUBLISH is stored) or into JSON files for Spark's file stream source: the same readings,
so the two sources can be compared in one session (``bench_spark_stream.py``) and a restarted
job checked for exactness (``spark_restarts.py``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

BASE_TS = 1_767_225_600.0  # 2026-01-01T00:00:00Z: event time of the first reading
TOPIC_FILTER = "sensors/+/+/temp"
READING_SCHEMA = "site STRING, device STRING, ts DOUBLE, temp DOUBLE"


def reading(i: int, sites: int, devices: int) -> tuple[str, dict]:
    """Reading ``i``: device ``i % devices`` of site ``i % sites``, a reading every 10 ms of event
    time (60,000 readings a 1-minute window), temperatures 18.0..27.9."""
    site, device = f"s{i % sites}", f"d{i % devices}"
    return f"sensors/{site}/{device}/temp", {"site": site, "device": device, "ts": BASE_TS + i / 100,
                                             "temp": 18 + (i * 7 % 100) / 10}


async def fill_store(store, first: int, count: int, sites: int, devices: int, batch: int = 20_000) -> None:
    """Readings [first, first + count) stored as MQTT QoS 1 publishes to their topic queues."""
    from gateway.interop import MQTT_FLAG
    from store import Message

    for lo in range(first, first + count, batch):
        rows = []
        for i in range(lo, min(first + count, lo + batch)):
            topic, body = reading(i, sites, devices)
            rows.append((Message(topic, json.dumps(body).encode(), flag=MQTT_FLAG | 1), [f"t:{topic}"]))
        await store.put_batch(rows)


def write_files(folder: Path, first: int, count: int, sites: int, devices: int, per_file: int) -> None:
    """Readings [first, first + count) as JSON-lines files of ``per_file`` readings, each written
    aside and renamed in (the file source must never see half a file)."""
    folder.mkdir(parents=True, exist_ok=True)
    for lo in range(first, first + count, per_file):
        lines = [json.dumps(reading(i, sites, devices)[1]) for i in range(lo, min(first + count, lo + per_file))]
        part = folder / f".readings-{lo:012d}.tmp"
        part.write_text("\n".join(lines) + "\n")
        os.rename(part, folder / f"readings-{lo:012d}.json")


def expected_averages(count: int, sites: int, devices: int, watermark_s: float) -> dict[tuple[str, float], tuple]:
    """(site, window start s) -> (count, average) of the 1-minute windows a watermark at
    ``watermark_s`` (event time) has closed, for readings [0, count)."""
    sums: dict[tuple[str, float], list[float]] = defaultdict(lambda: [0, 0.0])
    for i in range(count):
        _, body = reading(i, sites, devices)
        key = (body["site"], math.floor(body["ts"] / 60) * 60)
        sums[key][0] += 1
        sums[key][1] += body["temp"]
    return {k: (n, total / n) for k, (n, total) in sums.items() if k[1] + 60 <= watermark_s}


def start_spark(master: str = "local[2]", app: str = "tidemq-stream-bench", python: str | None = None,
                conf: dict[str, str] | None = None):
    """A session whose Python workers run ``python`` (this interpreter; or its environment's
    ``tidemq-spark-python``, spark_sinks/python.py), the tidemq format registered; ``conf``:
    further Spark settings."""
    os.environ["PYSPARK_PYTHON"] = python or sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark_sinks import register

    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.python.filterPushdown.enabled", "true")
             .config("spark.ui.showConsoleProgress", "false")
             .config(map=conf or {})
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def spark_python(kind: str) -> str:
    """The Python for Spark's Python processes: ``plain`` (this interpreter) or ``launcher``
    (``tidemq-spark-python`` beside it: pyspark imported with its bytecode)."""
    if kind == "plain":
        return sys.executable
    launcher = Path(sys.executable).parent / "tidemq-spark-python"
    if not launcher.exists():
        raise SystemExit(f"{launcher} is missing: pip install -e . in this checkout installs it")
    return str(launcher)


def tidemq_readings(spark, address: str, max_per_trigger: int | None, **options: str):
    """The readings as a Kafka-source user reads them: (value parsed, the store's columns)."""
    reader = (spark.readStream.format("tidemq").option("address", address).option("topicFilter", TOPIC_FILTER)
              .option("schema", "kafka").option("startingOffsets", "earliest").options(**options))
    if max_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", max_per_trigger)
    return reader.load()


def parsed(df):
    """The Kafka-shaped rows with the JSON value parsed into columns and an event time."""
    from pyspark.sql import functions as F

    body = F.from_json(F.col("value").cast("string"), READING_SCHEMA)
    return (df.select(body.alias("r"), "topic", "partition", "offset")
            .select("r.*", "topic", "partition", "offset")
            .withColumn("event_time", F.col("ts").cast("timestamp")))


def site_averages(readings, watermark: str = "1 minute"):
    """The job's aggregate: average temperature per site per 1-minute window, under a watermark."""
    from pyspark.sql import functions as F

    return (readings.withWatermark("event_time", watermark)
            .groupBy("site", F.window("event_time", "1 minute"))
            .agg(F.count(F.lit(1)).alias("n"), F.avg("temp").alias("avg_temp"))
            .select("site", F.col("window.start").alias("window_start"), "n", "avg_temp"))
