"""One local Spark session for the whole test run (it takes ~15 s to start): local[2], no UI,
Python workers on this interpreter, the ``tidemq`` source registered."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path


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


async def publish_readings(port: int, topics: list[str]) -> None:
    """Reading ``i`` (payload ``str(i)``) on ``topics[i]``, from one MQTT client at QoS 1."""
    from tests.mqtt_support import PahoClient

    device = PahoClient(port, "device")
    await device.connect()
    for i, topic in enumerate(topics):
        await device.publish(topic, b"%d" % i, qos=1)
    await device.disconnect()


async def spark_submit(*args: str, cwd: Path, timeout_s: float = 240) -> dict:
    """``spark-submit ARGS`` as a user runs it with pip's pyspark (its package the Spark
    installation, none of this run's PYTHONPATH or PYSPARK_* settings; loopback only, no UI),
    in a session of its own that a timeout kills whole (the driver's JVM and a local cluster's).
    The job's last line of output, JSON; a failed job fails the test with its errors."""
    import pyspark

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
    submit = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "spark-submit"), "--conf", "spark.ui.enabled=false",
        "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1", *args,
        cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(submit.communicate(), timeout_s)
    finally:
        if submit.returncode is None:
            os.killpg(submit.pid, signal.SIGKILL)
            await submit.wait()
    errors = [line for line in err.decode().splitlines() if "Error" in line or "Exception:" in line]
    assert submit.returncode == 0, "\n".join(errors[:20]) or err.decode()[-4000:]
    return json.loads(out.decode().strip().splitlines()[-1])
