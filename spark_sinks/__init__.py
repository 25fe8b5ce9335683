"""PySpark side of TideMQ: a streaming data source over store queues and sinks for results.

``register(spark)`` makes ``spark.read.format("tidemq")`` and ``spark.readStream.format("tidemq")``
available (``spark_sinks/source.py``). Importing this package does not import pyspark.
"""


def register(spark) -> None:
    """Register the ``tidemq`` data source with a SparkSession."""
    from .source import TideMQDataSource

    spark.dataSource.register(TideMQDataSource)
