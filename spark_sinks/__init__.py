"""PySpark sinks of TideMQ: DataFrame rows published into TideMQ topics (``writer.py``), and
example jobs (``jobs/``). The reading side of the ``tidemq`` format, the source and its data-API
client, is in ``bridge/`` (``spark_source.py``, ``spark_options.py``, ``data_client.py``).

``register(spark)`` makes the whole format available: ``spark.read.format("tidemq")``,
``spark.readStream.format("tidemq")``, ``df.write.format("tidemq")`` and
``df.writeStream.format("tidemq")``. Importing this package does not import pyspark.

It also turns on ``spark.sql.python.filterPushdown.enabled`` (off by default in Spark 4.x):
the source's batch reader takes topic and time predicates (``bridge/pushdown.py``), and Spark
refuses to run a Python reader with ``pushFilters`` while that setting is off
(DATA_SOURCE_PUSHDOWN_DISABLED). It only lets Python sources that implement ``pushFilters``
use them; sources that do not are unaffected. A query planned in a thread where the session is
not active (a thread pool's, as ``asyncio.to_thread``) reads Spark's defaults instead of the
session's settings, so set it when building the session as well
(``.config("spark.sql.python.filterPushdown.enabled", "true")``), as ``tests/spark_support.py`` does.

It registers the format through ``registration.py`` rather than ``spark.dataSource.register``:
several streaming queries over the format in one driver (each started from its checkpoint) must
not break each other's tasks, which PySpark's own registration allows.
"""

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark) -> None:
    """Register the ``tidemq`` data source (read and write) with a SparkSession."""
    from .registration import register_data_source
    from .writer import TideMQDataSource

    register_data_source(spark, TideMQDataSource)
    spark.conf.set(PUSHDOWN_CONF, "true")
