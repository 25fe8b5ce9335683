"""A job as a user submits it with the tidemq wheel sent along (``spark-submit --py-files``), run
by tests/test_spark_shipping.py: a batch read and a streaming read (``Trigger.AvailableNow``)
of a topic filter over a gateway's data API, and where the driver found ``spark_sinks`` and the
executors' Python ``bridge``.
Prints one JSON line: what it read and the paths.

    spark-submit --py-files tidemq-*.whl spark_shipped_job.py ADDRESS TOPIC_FILTER CHECKPOINT
"""

from __future__ import annotations

import json
import sys


def where_bridge_is(_: int) -> str:
    import bridge

    return bridge.__file__


def main() -> None:
    address, topic_filter, checkpoint = sys.argv[1:4]
    from pyspark.sql import SparkSession

    import spark_sinks
    from spark_sinks import register

    spark = SparkSession.builder.appName("tidemq-shipped").getOrCreate()
    register(spark)
    executors = spark.sparkContext.parallelize(range(2), 2).map(where_bridge_is).collect()
    batch = (spark.read.format("tidemq").option("address", address).option("topicFilter", topic_filter)
             .option("schema", "kafka").load())
    batch_values = sorted(r.value.decode() for r in batch.select("value").collect())
    streamed: list[str] = []

    def keep(df, _batch_id: int) -> None:
        streamed.extend(r.value.decode() for r in df.select("value").collect())

    query = (spark.readStream.format("tidemq").option("address", address).option("topicFilter", topic_filter)
             .option("schema", "kafka").option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 7)
             .load().writeStream.foreachBatch(keep).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    print(json.dumps({"driver": spark_sinks.__file__, "executors": executors, "batch": batch_values, "stream": sorted(streamed)}))
    spark.stop()


if __name__ == "__main__":
    main()
