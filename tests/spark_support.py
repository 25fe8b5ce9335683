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
