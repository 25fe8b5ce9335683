"""PySpark side of TideMQ: a streaming data source over store queues and sinks for results.

``register(spark)`` makes ``spark.read.format("tidemq")`` and ``spark.readStream.format("tidemq")``
available (``spark_sinks/source.py``), and the sink ``df.write.format("tidemq")`` /
``df.writeStream.format("tidemq")`` (``spark_sinks/writer.py``); example jobs are in
``spark_sinks/jobs/``. Importing this package does not import pyspark.
"""


def register(spark) -> None:
    """Register the ``tidemq`` data source with a SparkSession."""
    from .source import TideMQDataSource

    spark.dataSource.register(TideMQDataSource)
