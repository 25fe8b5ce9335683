"""PySpark sinks of TideMQ: DataFrame rows published into TideMQ topics (``writer.py``), and
example jobs (``jobs/``). The reading side of the ``tidemq`` format, the source and its data-API
client, is in ``bridge/`` (``spark_source.py``, ``spark_options.py``, ``data_client.py``).

``register(spark)`` makes the whole format available: ``spark.read.format("tidemq")``,
``spark.readStream.format("tidemq")``, ``df.write.format("tidemq")`` and
``df.writeStream.format("tidemq")``. Importing this package does not import pyspark.
"""


def register(spark) -> None:
    """Register the ``tidemq`` data source (read and write) with a SparkSession."""
    from .writer import TideMQDataSource

    spark.dataSource.register(TideMQDataSource)
