"""The Spark source sent with a job: ``spark-submit --py-files`` with the pure-Python wheel
(``TIDEMQ_BUILD_PURE=1``, setup.py) onto a ``local-cluster`` whose executors run in JVMs of their
own, the driver and the executors with a Python that has tidemq's dependencies but not tidemq
(docs/spark.md, "Shipping the source to a standalone cluster"): the job, the driver's Python
workers and the executors' import it from the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.mqtt_support import mqtt_port, running_gateway
from tests.spark_support import publish_readings, spark_submit

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "spark_shipped_job.py"


def pure_wheel(out: Path) -> Path:
    """The wheel a user sends with a job, built from this checkout, under a ``.zip`` name (PySpark
    puts only .zip, .egg and .jar files of ``--py-files`` on its workers' path)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(out), str(ROOT)], check=True, env={**os.environ, "TIDEMQ_BUILD_PURE": "1"}, cwd=out)
    (wheel,) = out.glob("tidemq-*-py3-none-any.whl")
    return wheel.rename(wheel.with_name(wheel.name + ".zip"))


def python_without_tidemq(where: Path) -> Path:
    """A Python for the executors: this interpreter with this environment's third-party packages
    (pyarrow, numpy, rocksdict, ...) on its path, but not tidemq, whose editable install is
    made by a .pth file that a plain path entry does not run."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (site,) = where.glob("lib/python*/site-packages")
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return where / "bin" / "python"


async def test_a_job_sent_with_the_wheel_reads_on_executors_without_tidemq(tmp_path: Path) -> None:
    wheel = pure_wheel(tmp_path)
    python = python_without_tidemq(tmp_path / "executor-python")
    missing = subprocess.run([str(python), "-c", "import bridge"], cwd=tmp_path, capture_output=True)
    assert missing.returncode != 0, "the executors' Python must not have tidemq of its own"
    readings = [f"sensors/s{i % 3}/d{i % 4}/temp" for i in range(30)]
    async with running_gateway(tmp_path / "data", metrics_bind="127.0.0.1:0") as gw:
        await publish_readings(mqtt_port(gw), readings)
        result = await spark_submit(
            "--master", "local-cluster[2,1,1024]", "--py-files", str(wheel),
            "--conf", f"spark.pyspark.python={python}", "--conf", f"spark.pyspark.driver.python={python}",
            str(JOB), "{}:{}".format(*gw.metrics_address), "sensors/+/+/temp", str(tmp_path / "checkpoint"),
            cwd=tmp_path)
    assert f"{wheel.name}/spark_sinks/__init__.py" in result["driver"], result["driver"]
    for path in result["executors"]:  # each executor's Python found the source in the wheel sent along
        assert f"{wheel.name}/bridge/__init__.py" in path, path
    expected = sorted(str(i) for i in range(len(readings)))
    assert result["batch"] == expected
    assert result["stream"] == expected  # (7 a micro-batch: several, each read on the executors)
