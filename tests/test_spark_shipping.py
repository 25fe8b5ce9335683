"""The Spark source sent with a job: ``spark-submit --py-files`` with the pure-Python wheel
(``TIDEMQ_BUILD_PURE=1``, setup.py) onto a ``local-cluster`` whose executors run in JVMs of their
own, the driver and the executors with a Python that has tidemq's dependencies but not tidemq
(docs/spark.md, "Shipping the source to a standalone cluster"): the job, the driver's Python
workers and the executors' import it from the wheel."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyspark

from tests.mqtt_support import PahoClient, mqtt_port, running_gateway

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
        device = PahoClient(mqtt_port(gw), "device")
        await device.connect()
        for i, topic in enumerate(readings):
            await device.publish(topic, b"%d" % i, qos=1)
        await device.disconnect()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
        env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)  # (pip's pyspark is the Spark installation)
        submit = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "spark-submit"), "--master", "local-cluster[2,1,1024]",
            "--py-files", str(wheel), "--conf", f"spark.pyspark.python={python}",
            "--conf", f"spark.pyspark.driver.python={python}", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            str(JOB), "{}:{}".format(*gw.metrics_address), "sensors/+/+/temp", str(tmp_path / "checkpoint"),
            cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        try:
            out, err = await asyncio.wait_for(submit.communicate(), 240)
        finally:
            if submit.returncode is None:  # (timed out: the driver's JVM and the cluster's go too)
                os.killpg(submit.pid, signal.SIGKILL)
                await submit.wait()
    errors = [line for line in err.decode().splitlines() if "Error" in line or "Exception:" in line]
    assert submit.returncode == 0, "\n".join(errors[:20]) or err.decode()[-4000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert f"{wheel.name}/spark_sinks/__init__.py" in result["driver"], result["driver"]
    for path in result["executors"]:  # each executor's Python found the source in the wheel sent along
        assert f"{wheel.name}/bridge/__init__.py" in path, path
    expected = sorted(str(i) for i in range(len(readings)))
    assert result["batch"] == expected
    assert result["stream"] == expected  # (7 a micro-batch: several, each read on the executors)
