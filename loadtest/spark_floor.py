"""The floor of PySpark's Python data source API under ``loadtest/bench_spark.py``'s queries: a
source that reads nothing -- each partition yields Arrow record batches built in memory, of the
columns the query asks for (``bench_spark.COLUMNS``) and the bench's shape (1,000 devices'
topics, ~40-byte JSON payloads, store times) -- against the same rows in Parquet, in one Spark
session (local[2]), the same queries (``bench_spark.aggregate``), best of ``--runs``.

    python -m loadtest.spark_floor [--records N] [--aggs groupcount,json] [--partitions 4] [--runs 3]

prints per aggregation::

    spark_floor records=1000000 batch_s=... cpu_s=... agg=groupcount partitions=4 vs_parquet=... cpu_vs_parquet=...
    spark_parquet records=1000000 batch_s=... cpu_s=... agg=groupcount

(``cpu_s``: bench_spark's, the CPU time of a run across the bench, Spark's JVM and its workers.)

No source that ships its rows through the Python data source API (Python worker -> Arrow ->
the JVM's rows) can do better than ``spark_floor``: it is the bound of the ``tidemq`` source's
``vs_parquet`` (issue 22's target is 0.8).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from loadtest.bench_spark import COLUMNS, DEVICES, measure, start_spark

_BATCH_ROWS = 65_536


def floor_source(records: int, partitions: int):
    """A Python data source yielding ``records`` rows (its partitions' share each) built in memory."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorReader(DataSourceReader):
        def __init__(self, schema) -> None:
            self.schema = schema

        def partitions(self):
            return [InputPartition(i) for i in range(partitions)]

        def read(self, partition):
            import pyarrow as pa
            import pyarrow.compute as pc

            names = [field.name for field in self.schema.fields]
            # partition i: rows [i * records // partitions, (i + 1) * records // partitions)
            start = partition.value * records // partitions
            share = (partition.value + 1) * records // partitions - start
            topics = pa.array([f"devices/d{i:04d}/telemetry" for i in range(DEVICES)])
            payloads = pa.array([b'{"temp": 21.5, "hum": 40, "seq": 123456}'] * 1024, pa.binary())
            done = 0
            while done < share:
                n = min(_BATCH_ROWS, share - done)
                index = pa.array(range(start + done, start + done + n), pa.int64())
                columns = {
                    "topic": pc.take(topics, pc.remainder(index, DEVICES)),
                    "payload": pc.take(payloads, pc.bit_wise_and(index, 1023)),
                    "timestamp": pc.cast(pc.multiply(pc.add(index, 1_700_000_000_000), 1000), pa.timestamp("us", tz="UTC")),
                }
                yield pa.RecordBatch.from_arrays([columns[name] for name in names], names=names)
                done += n

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "tidemqfloor"

        def schema(self) -> str:
            return COLUMNS["json"]

        def reader(self, schema):
            return FloorReader(schema)

    return Floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--aggs", default="groupcount,json")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    spark = start_spark()
    spark.dataSource.register(floor_source(args.records, args.partitions))
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-spark-floor-"))
    try:
        parquet = str(tmp / "floor.parquet")
        spark.read.format("tidemqfloor").load().write.parquet(parquet)  # (untimed)
        for agg in args.aggs.split(","):
            floor_s, floor_cpu, _ = measure(
                lambda agg=agg: spark.read.format("tidemqfloor").schema(COLUMNS[agg]).load(), agg, args.records,
                args.runs)
            parquet_s, parquet_cpu, _ = measure(lambda: spark.read.parquet(parquet), agg, args.records, args.runs)
            print(f"spark_floor records={args.records} batch_s={floor_s:.2f} cpu_s={floor_cpu:.2f} agg={agg} "
                  f"partitions={args.partitions} vs_parquet={parquet_s / floor_s:.2f} "
                  f"cpu_vs_parquet={parquet_cpu / floor_cpu:.2f}", flush=True)
            print(f"spark_parquet records={args.records} batch_s={parquet_s:.2f} cpu_s={parquet_cpu:.2f} agg={agg}",
                  flush=True)
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
