"""Device uptime per day, from the presence events the MQTT gateway stores (docs/mqtt.md, Presence
events): each connection of a client is the interval from its ``connected_at`` to its
``disconnected_at``, and a device's uptime on a day (UTC) is how much of that day its
connections cover, overlaps (a takeover, two sessions at once) counted once.

    python -m spark_sinks.jobs.device_uptime --address GATEWAY:9100 [--output OUT] [--as-of MS]
    spark-submit spark_sinks/jobs/device_uptime.py --address GATEWAY:9100 --output OUT

A batch job: it reads every stored event with the ``tidemq`` source, through the wildcard queue
of ``$SYS/brokers/+/clients/+/+`` (each gateway node holds that filter from its start while
``presence_events`` is on, so the queue has every event since), and writes the rows
``clientid, day, uptime_s, connections`` to Parquet under ``--output`` (else prints them).

A connection whose disconnected event is missing -- still connected, or its gateway was killed
before it could write one -- ends at the client's next connection, else at ``--as-of`` (ms since
the epoch; default: now). Undecodable events are left out.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from bridge.decode import decode_json, topic_columns, topic_filter
from spark_sinks import register

log = logging.getLogger("tidemq.spark")

TEMPLATE = "$SYS/brokers/{node}/clients/{client}/{event}"  # (client: the id percent-encoded; the body has it as is)
EVENT_SCHEMA = "clientid string, connected_at long, disconnected_at long"
DAY_MS = 86_400_000


def read_events(spark: SparkSession, address: str, token: str | None = None) -> DataFrame:
    """Every stored presence event: the ``tidemq`` source's rows (``topic``, ``payload``, ...)."""
    options = {"address": address, "topicFilter": topic_filter(TEMPLATE), "startingOffsets": "earliest"}
    if token:
        options["token"] = token
    return spark.read.format("tidemq").options(**options).load()


def connections(events: DataFrame, as_of_ms: int) -> DataFrame:
    """``clientid, node, start_ms, end_ms``: one row per connection, from rows with ``topic``
    and ``payload`` columns (the source's), cut at ``as_of_ms``."""
    decoded = decode_json(topic_columns(events.select("topic", "payload"), TEMPLATE), EVENT_SCHEMA,
                          into="e", required=("clientid", "connected_at"))
    rows = decoded.where(F.col("error").isNull() & F.col("event").isNotNull()).select(
        F.col("e.clientid").alias("clientid"), "node", "event",
        F.col("e.connected_at").alias("start_ms"), F.col("e.disconnected_at").alias("down_ms"))
    key = ["clientid", "node", "start_ms"]  # a disconnected event names its connection's start
    ups = rows.where(F.col("event") == "connected").select(*key).dropDuplicates()
    ups = ups.withColumn("next_ms", F.lead("start_ms").over(Window.partitionBy("clientid").orderBy("start_ms")))
    downs = rows.where(F.col("event") == "disconnected").groupBy(*key).agg(F.min("down_ms").alias("down_ms"))
    as_of = F.lit(as_of_ms)
    # (a disconnected event without its connected one still says when the connection started)
    end = F.least(F.coalesce(F.col("down_ms"), F.col("next_ms"), as_of), as_of)
    return (ups.join(downs, key, "full").select(*key, end.alias("end_ms"))
            .where(F.col("end_ms") > F.col("start_ms")))


def uptime_per_day(conns: DataFrame) -> DataFrame:
    """``clientid, day, uptime_s, connections`` from ``connections()``: UTC days, each client's
    connections merged first (what one covers that an earlier one did already is not counted)."""
    earlier = Window.partitionBy("clientid").orderBy("start_ms", "end_ms").rowsBetween(Window.unboundedPreceding, -1)
    covered = F.max("end_ms").over(earlier)
    merged = (conns.withColumn("start_ms", F.greatest("start_ms", F.coalesce(covered, F.col("start_ms"))))
              .where(F.col("end_ms") > F.col("start_ms")))
    days = merged.withColumn("day_index", F.explode(F.sequence(
        F.floor(F.col("start_ms") / DAY_MS), F.floor((F.col("end_ms") - 1) / DAY_MS))))
    day_start = F.col("day_index") * DAY_MS
    covered_ms = F.least(F.col("end_ms"), day_start + DAY_MS) - F.greatest(F.col("start_ms"), day_start)
    return (days.groupBy("clientid", F.expr("date_from_unix_date(CAST(day_index AS INT))").alias("day"))
            .agg((F.sum(covered_ms) / 1000).alias("uptime_s"), F.count(F.lit(1)).alias("connections"))
            .orderBy("clientid", "day"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m spark_sinks.jobs.device_uptime",
                                description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--address", required=True, help="the gateway's metrics listener HOST:PORT (--metrics-bind); "
                   "in a cluster, the store node's")
    p.add_argument("--token", default=os.environ.get("TIDEMQ_ADMIN_TOKEN"),
                   help="the gateway's admin_token (default $TIDEMQ_ADMIN_TOKEN)")
    p.add_argument("--output", help="Parquet directory of the rows (default: print them)")
    p.add_argument("--as-of", type=int, help="where connections without an end stop, ms since the epoch "
                   "(default: now)")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from pyspark import SparkConf

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers on this Python (local runs)
    builder = SparkSession.builder.appName("tidemq-device-uptime")
    if args.master:
        builder = builder.master(args.master)
    elif not SparkConf().contains("spark.master"):  # python -m: no spark-submit around
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    as_of = args.as_of if args.as_of is not None else int(time.time() * 1000)
    rows = uptime_per_day(connections(read_events(spark, args.address, args.token), as_of))
    if args.output:
        rows.write.mode("overwrite").parquet(args.output)
        log.info("device_uptime written output=%s as_of=%d", args.output, as_of)
    else:
        rows.show(1000, truncate=False)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
