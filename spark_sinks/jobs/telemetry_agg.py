"""Telemetry aggregation: per-device 1-minute tumbling windows of min/avg/max/count of a numeric
field of JSON readings, with a 2-minute watermark, written to Parquet; readings above a
threshold published back over TideMQ to ``alerts/{device}`` (MQTT devices and AMQP apps get them).

    python -m spark_sinks.jobs.telemetry_agg --address GATEWAY:9100 --checkpoint CKPT --output OUT
    spark-submit spark_sinks/jobs/telemetry_agg.py --address GATEWAY:9100 --checkpoint CKPT --output OUT

(tidemq installed, with its ``spark`` extra, wherever the driver and the executors run.)

Readings are MQTT messages on ``devices/{device}/telemetry`` (``--topic``; ``{device}`` becomes
a column) with a JSON payload such as ``{"ts": 1767225600.5, "temp": 21.5}``: the field
(``--field``, a number) and the event time (``--time-field``, seconds since the epoch; the
store's timestamp when absent). They are read with the ``tidemq`` source from the topic queues
of the topic's filter (``devices/+/telemetry``): everything stored, whether or not an MQTT
client subscribes, and devices that appear while the job runs. Undecodable readings (``bridge.decode``) are left out of both outputs, and written
with their error to ``--errors`` when given.

Two streaming queries (checkpoints ``CKPT/aggregates`` and ``CKPT/alerts``):

- aggregates: event-time windows (``--window``) closed by the watermark (``--watermark``) are
  appended to Parquet under ``--output``: device, window_start, window_end, min, avg, max,
  count. A window appears once the watermark -- the latest event time seen minus the delay --
  passes its end; readings later than that are dropped (Spark's append mode).
- alerts: each reading above ``--threshold`` is published to ``--alert-topic`` with QoS 1 and
  the payload ``{"device", FIELD, "ts", "threshold", "queue", "offset"}`` (``queue``/``offset``
  name the reading in the store, one alert per reading). Through the sink's batch keys, a
  restart from the checkpoint re-runs the interrupted micro-batch without publishing twice.

In EventBridge's terms (source -> filter -> transform -> sink): the ``tidemq`` source,
decodable readings above the threshold, ``bridge.decode`` and ``format_topic``, and the
``tidemq`` sink (or Parquet).

Both queries restart from their checkpoints: Parquet's file log and the sink's batch keys make
the outputs exact across restarts. ``--trigger`` is a processing-time interval (``1 second``)
or ``available-now`` (process what is there, then stop); ``--aggregates-trigger`` gives the
aggregation a longer interval of its own (windows close once a minute; the alerts keep theirs).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from bridge.decode import (
    decode_json,
    format_topic,
    level_names,
    topic_columns,
    topic_filter,
)
from spark_sinks import register

log = logging.getLogger("tidemq.spark")

AVAILABLE_NOW = "available-now"


@dataclass(frozen=True, slots=True)
class JobConfig:
    address: str
    checkpoint: str
    output: str
    token: str | None = None
    topic: str = "devices/{device}/telemetry"
    field: str = "temp"
    time_field: str = "ts"
    threshold: float = 30.0
    alert_topic: str = "alerts/{device}"
    window: str = "1 minute"
    watermark: str = "2 minutes"
    trigger: str = "1 second"
    aggregates_trigger: str | None = None  # None: as trigger (windows need no 1 s cadence)
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    errors: str | None = None  # where undecodable readings go (Parquet); None: nowhere
    publish_address: str | None = None  # where alerts are published; None: address (a cluster: a gateway node)

    def source_options(self) -> dict[str, str]:
        opts = {"address": self.address, "topicFilter": topic_filter(self.topic),
                "startingOffsets": self.starting_offsets}
        if self.token:
            opts["token"] = self.token
        if self.max_offsets_per_trigger:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return opts


def decoded(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """The stream of readings: store rows, topic levels as columns, the payload decoded."""
    rows = spark.readStream.format("tidemq").options(**cfg.source_options()).load()
    rows = topic_columns(rows, cfg.topic)
    schema = f"`{cfg.field}` double, `{cfg.time_field}` double"
    return decode_json(rows, schema, into="reading", required=(cfg.field,))


def readings(df: DataFrame, cfg: JobConfig) -> DataFrame:
    """Decodable readings: the template's columns, ``value``, ``event_time``, ``queue``, ``offset``."""
    levels = level_names(cfg.topic)
    seconds = F.col("reading").getField(cfg.time_field)
    return df.where(F.col("error").isNull()).select(
        *levels, F.col("reading").getField(cfg.field).alias("value"),
        F.coalesce(F.timestamp_seconds(seconds), F.col("timestamp")).alias("event_time"), "queue", "offset")


def aggregates(df: DataFrame, cfg: JobConfig) -> DataFrame:
    window = F.window("event_time", cfg.window)
    return (df.withWatermark("event_time", cfg.watermark)
            .groupBy(window.alias("window"), *level_names(cfg.topic))
            .agg(F.min("value").alias("min"), F.avg("value").alias("avg"), F.max("value").alias("max"),
                 F.count(F.lit(1)).alias("count"))
            .select(*level_names(cfg.topic), F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), "min", "avg", "max", "count"))


def alerts(df: DataFrame, cfg: JobConfig) -> DataFrame:
    """Rows for the ``tidemq`` sink: one alert per reading above the threshold."""
    body = F.struct(*[F.col(c) for c in level_names(cfg.topic)], F.col("value").alias(cfg.field),
                    (F.unix_micros("event_time") / 1e6).cast("decimal(20,6)").alias("ts"),
                    F.lit(cfg.threshold).alias("threshold"), "queue", "offset")
    return df.where(F.col("value") > F.lit(cfg.threshold)).select(
        format_topic(cfg.alert_topic).alias("topic"), F.to_json(body).alias("payload"), F.lit(1).alias("qos"))


def _trigger(writer, cfg: JobConfig, interval: str | None = None):
    if cfg.trigger == AVAILABLE_NOW:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=interval or cfg.trigger)


def start(spark: SparkSession, cfg: JobConfig) -> list[StreamingQuery]:
    """Start the job's queries (aggregates, alerts, and errors when configured)."""
    queries = []
    source = decoded(spark, cfg)
    agg = (aggregates(readings(source, cfg), cfg).writeStream.format("parquet").outputMode("append")
           .option("path", cfg.output).option("checkpointLocation", os.path.join(cfg.checkpoint, "aggregates"))
           .queryName("telemetry_aggregates"))
    queries.append(_trigger(agg, cfg, cfg.aggregates_trigger).start())
    source = decoded(spark, cfg)  # each query reads the stream itself, from its own checkpoint
    sink = {"address": cfg.publish_address or cfg.address, **({"token": cfg.token} if cfg.token else {})}
    out = (alerts(readings(source, cfg), cfg).writeStream.format("tidemq").options(**sink)
           .option("checkpointLocation", os.path.join(cfg.checkpoint, "alerts")).queryName("telemetry_alerts"))
    queries.append(_trigger(out, cfg).start())
    if cfg.errors:
        bad = decoded(spark, cfg).where(F.col("error").isNotNull()).select(
            "topic", "queue", "offset", "timestamp", "error", "payload")
        out = (bad.writeStream.format("parquet").option("path", cfg.errors)
               .option("checkpointLocation", os.path.join(cfg.checkpoint, "errors")).queryName("telemetry_errors"))
        queries.append(_trigger(out, cfg).start())
    return queries


def parse_args(argv: list[str] | None = None) -> tuple[JobConfig, argparse.Namespace]:
    d = JobConfig("", "", "")
    p = argparse.ArgumentParser(prog="python -m spark_sinks.jobs.telemetry_agg",
                                description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--address", required=True, help="the gateway's metrics listener HOST:PORT (--metrics-bind)")
    p.add_argument("--publish-address", help="where to publish the alerts (default: --address; in a cluster the "
                   "store node serves reads and the gateway nodes, which run MQTT, take publishes)")
    p.add_argument("--token", default=os.environ.get("TIDEMQ_ADMIN_TOKEN"),
                   help="the gateway's admin_token (default $TIDEMQ_ADMIN_TOKEN)")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (one subdirectory per query)")
    p.add_argument("--output", required=True, help="Parquet directory of the window aggregates")
    p.add_argument("--errors", help="Parquet directory for undecodable readings (default: dropped)")
    p.add_argument("--topic", default=d.topic, help="topic template of the readings; {name} levels become columns (default: %(default)s)")
    p.add_argument("--field", default=d.field, help="the numeric JSON field aggregated (default: %(default)s)")
    p.add_argument("--time-field", default=d.time_field, help="JSON field of the event time, seconds since the "
                   "epoch (absent: the store time) (default: %(default)s)")
    p.add_argument("--threshold", type=float, default=d.threshold, help="readings above it raise an alert (default: %(default)s)")
    p.add_argument("--alert-topic", default=d.alert_topic, help="topic template of the alerts (default: %(default)s)")
    p.add_argument("--window", default=d.window, help="tumbling window length (default: %(default)s)")
    p.add_argument("--watermark", default=d.watermark, help="how late a reading may be (default: %(default)s)")
    p.add_argument("--trigger", default=d.trigger, help=f"processing-time interval, or {AVAILABLE_NOW} (default: %(default)s)")
    p.add_argument("--aggregates-trigger", help="processing-time interval of the aggregation (default: --trigger); "
                   "a longer one leaves the cores to the alerts")
    p.add_argument("--starting-offsets", default=d.starting_offsets, choices=["earliest", "latest"],
                   help="where a new query starts (default: %(default)s; a restart goes on from its "
                   "checkpoint)")
    p.add_argument("--max-offsets-per-trigger", type=int, help="at most this many readings per micro-batch")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--shuffle-partitions", type=int,
                   help="state partitions of the aggregation (default: the cores; fixed by the first run's checkpoint)")
    p.add_argument("--timeout", type=float, help="stop after this many seconds (default: run until stopped)")
    args = p.parse_args(argv)
    cfg = JobConfig(address=args.address, token=args.token or None, checkpoint=args.checkpoint, output=args.output,
                    topic=args.topic, field=args.field, time_field=args.time_field, threshold=args.threshold,
                    alert_topic=args.alert_topic, window=args.window, watermark=args.watermark, trigger=args.trigger,
                    aggregates_trigger=args.aggregates_trigger,
                    starting_offsets=args.starting_offsets, max_offsets_per_trigger=args.max_offsets_per_trigger,
                    errors=args.errors, publish_address=args.publish_address)
    topic_filter(cfg.topic)  # a bad template fails here, not in Spark
    return cfg, args


def session(master: str | None, shuffle_partitions: int | None) -> SparkSession:
    from pyspark import SparkConf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers on this Python (local runs)
    builder = SparkSession.builder.appName("tidemq-telemetry-agg")
    if master:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):  # python -m: no spark-submit around
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    partitions = shuffle_partitions or spark.sparkContext.defaultParallelism
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    return spark


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    spark = session(args.master, args.shuffle_partitions)
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    queries = start(spark, cfg)
    log.info("telemetry_agg started queries=%s filter=%s output=%s", ",".join(q.name for q in queries),
             topic_filter(cfg.topic), cfg.output)
    try:
        if cfg.trigger == AVAILABLE_NOW:
            for q in queries:
                q.awaitTermination(args.timeout)
        else:
            spark.streams.awaitAnyTermination(args.timeout)
    except KeyboardInterrupt:
        pass
    failed = [q for q in queries if q.exception() is not None]
    for q in queries:
        q.stop()
    for q in failed:
        log.error("query %s failed: %s", q.name, q.exception())
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
