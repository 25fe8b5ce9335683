"""A job run by tests/test_spark_python.py with ``spark.pyspark.python`` set to the Python under
test: where each kind of Spark's Python processes found pyspark (a probe stream source notes it
in the stream's source runner and planner, and in the executors' reads), and what a tidemq
stream of a topic filter read (``Trigger.AvailableNow``). Prints one JSON line.

    spark-submit --conf spark.pyspark.python=PYTHON spark_python_job.py ADDRESS TOPIC_FILTER WORK
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


def note(folder: str, role: str) -> None:
    import pyspark

    with open(os.path.join(folder, f"{role}-{os.getpid()}"), "w") as f:
        f.write(pyspark.__file__ or "")


class ProbeStream(DataSourceStreamReader):
    def __init__(self, folder: str) -> None:
        self.folder = folder
        note(folder, "stream_reader")  # the stream's source runner, and the planner

    def initialOffset(self) -> dict:
        note(self.folder, "offsets")  # the source runner only
        return {"n": 0}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        return {"n": 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition):
        note(self.folder, "read")  # an executor's Python worker
        yield (os.getpid(),)


class Probe(DataSource):
    @classmethod
    def name(cls) -> str:
        return "probe"

    def schema(self) -> str:
        return "pid int"

    def streamReader(self, schema) -> ProbeStream:
        return ProbeStream(self.options["folder"])


def main() -> None:
    address, topic_filter, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    from pyspark.sql import SparkSession

    from spark_sinks import register

    spark = SparkSession.builder.appName("tidemq-spark-python").getOrCreate()
    register(spark)
    spark.dataSource.register(Probe)
    notes = work / "notes"
    notes.mkdir(parents=True)
    (spark.readStream.format("probe").option("folder", str(notes)).load().writeStream.format("noop")
     .option("checkpointLocation", str(work / "probe-ckpt")).trigger(availableNow=True).start().awaitTermination())
    streamed: list[str] = []

    def keep(df, _batch_id: int) -> None:
        streamed.extend(r.value.decode() for r in df.select("value").collect())

    (spark.readStream.format("tidemq").option("address", address).option("topicFilter", topic_filter)
     .option("schema", "kafka").option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 7).load()
     .writeStream.foreachBatch(keep).option("checkpointLocation", str(work / "ckpt")).trigger(availableNow=True)
     .start().awaitTermination())
    where = {p.name: p.read_text() for p in sorted(notes.iterdir())}
    print(json.dumps({"pyspark": where, "stream": sorted(streamed)}))
    spark.stop()


if __name__ == "__main__":
    main()
