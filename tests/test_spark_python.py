"""``tidemq-spark-python`` (spark_sinks/python.py) as ``spark.pyspark.python``: every kind of
Spark's Python processes -- a stream's source runner and planner on the driver's host, the
executors' workers -- imports the installed pyspark (cached bytecode), not Spark's archive of
it, and a tidemq stream through it reads every message once."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pyspark

from spark_sinks.python import without_installed_archive
from tests.mqtt_support import mqtt_port, running_gateway
from tests.spark_support import publish_readings, spark_submit

JOB = Path(__file__).resolve().parent / "spark_python_job.py"
LAUNCHER = Path(sys.executable).parent / "tidemq-spark-python"


def fake_pyspark(where: Path, version: bytes, archived: bytes) -> str:
    """A pip-style pyspark package under ``where`` whose ``python/lib/pyspark.zip`` holds
    ``archived`` as its version.py; the archive's path."""
    package = where / "pyspark"
    (package / "python" / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "version.py").write_bytes(version)
    archive = package / "python" / "lib" / "pyspark.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pyspark/version.py", archived)
    return str(archive)


def test_only_the_installed_packages_own_archive_of_the_same_release_leaves_the_path(tmp_path: Path) -> None:
    same = fake_pyspark(tmp_path / "a", b'__version__ = "4.3.0"\n', b'__version__ = "4.3.0"\n')
    other_release = fake_pyspark(tmp_path / "b", b'__version__ = "4.3.0"\n', b'__version__ = "4.2.1"\n')
    spark_home = tmp_path / "spark" / "python" / "lib"  # a Spark installation's, no package around it
    spark_home.mkdir(parents=True)
    with zipfile.ZipFile(spark_home / "pyspark.zip", "w") as z:
        z.writestr("pyspark/version.py", b'__version__ = "4.3.0"\n')
    missing = str(tmp_path / "c" / "pyspark" / "python" / "lib" / "pyspark.zip")
    path = ["/cwd", same, other_release, str(spark_home / "pyspark.zip"), missing, "/site"]
    assert without_installed_archive(path) == ["/cwd", other_release, str(spark_home / "pyspark.zip"), missing, "/site"]


async def test_sparks_python_processes_import_the_installed_pyspark_and_the_stream_is_exact(tmp_path: Path) -> None:
    assert LAUNCHER.exists(), f"{LAUNCHER}: pip install -e . installs it"
    readings = [f"sensors/s{i % 3}/d{i % 4}/temp" for i in range(30)]
    async with running_gateway(tmp_path / "data", metrics_bind="127.0.0.1:0") as gw:
        await publish_readings(mqtt_port(gw), readings)
        result = await spark_submit(
            "--master", "local[2]", "--conf", f"spark.pyspark.python={LAUNCHER}",
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            str(JOB), "{}:{}".format(*gw.metrics_address), "sensors/+/+/temp", str(tmp_path / "work"), cwd=tmp_path)
    roles = {name.split("-")[0] for name in result["pyspark"]}
    assert roles == {"stream_reader", "offsets", "read"}, result["pyspark"]
    assert sum(name.startswith("stream_reader-") for name in result["pyspark"]) >= 2  # source runner, planner
    installed = str(Path(pyspark.__file__))
    assert set(result["pyspark"].values()) == {installed}, result["pyspark"]  # not .../pyspark.zip/pyspark/...
    assert result["stream"] == sorted(str(i) for i in range(len(readings)))
