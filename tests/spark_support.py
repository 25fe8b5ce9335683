"""One local Spark session for the whole test run (it takes ~15 s to start): local[2], no UI,
Python workers on this interpreter, the ``tidemq`` source registered."""

from __future__ import annotations

import os
import shutil
import sys


def start_spark():
    if shutil.which("java") is None:
        raise RuntimeError("the Spark tests need Java 17 (java on PATH): apt-get install openjdk-17-jre-headless")
    # Spark starts its Python workers with `python3` from PATH unless told: use this venv's
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark_sinks import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidemq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        # the source's filter pushdown, also for queries planned in asyncio.to_thread's threads
        # (no active session there: spark_sinks.register's session setting is not seen)
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def activate(spark) -> None:
    """Make ``spark`` the active session of the calling thread. PySpark looks Python data
    sources up for writes (``df.write.format("tidemq")``, ``writeStream.format("tidemq")``) in
    the JVM thread's active session, which a thread of ``asyncio.to_thread`` has not got."""
    from pyspark.sql import SparkSession

    SparkSession._get_j_spark_session_class(spark._jvm).setActiveSession(spark._jsparkSession)


def num_partitions(spark, df) -> int:
    """``df.rdd.getNumPartitions()`` from any thread. ``.rdd`` plans outside the session's scope,
    so in a thread where no session is active (``asyncio.to_thread``'s) Spark plans with its
    default settings, and the source's reader (which pushes filters) is refused while
    ``spark.sql.python.filterPushdown.enabled`` is at its default (false)."""
    activate(spark)
    return df.rdd.getNumPartitions()
