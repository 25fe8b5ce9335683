"""Registering a Python data source with a session so that queries running side by side cannot
break each other's tasks.

Spark keeps one environment map per registered Python data source and hands that very map to
every query over the format: the tasks it serialises carry it, and the driver's streaming
source runner adds entries to it when a query starts. With PySpark's own registration it is a
``java.util.HashMap``, which serialised while another query's start adds to it yields bytes that
no longer read back (``java.io.OptionalDataException`` in task deserialisation). Here the map is
a ``ConcurrentHashMap``, whose serialised form stays whole under concurrent writes.

The map also names, on ``PYTHONPATH``, the driver's copies of the job's ``--py-files``: Spark's
streaming source runner (the driver's Python process that plans a stream's micro-batches) does
not look for them where the driver keeps them, so a source sent with the job as a wheel would
not import there (executors put them on their path themselves, ahead of this).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSource

DATA_SOURCE_CLASS = "org.apache.spark.sql.execution.datasources.v2.python.UserDefinedPythonDataSource"


def register_data_source(spark, source_class: type[DataSource]) -> None:
    """As ``spark.dataSource.register(source_class)``, with an environment map that is safe to
    serialise while Spark writes to it."""
    from pyspark.core.rdd import _prepare_for_python_RDD

    sc = spark.sparkContext
    jvm = sc._jvm
    pickled, broadcast_vars, env, includes = _prepare_for_python_RDD(sc, source_class)
    shared_env = jvm.java.util.concurrent.ConcurrentHashMap()
    for name, value in {**env, **driver_includes(env, includes)}.items():
        shared_env.put(name, value)
    function = jvm.SimplePythonFunction(bytearray(pickled), shared_env, includes, sc.pythonExec, sc.pythonVer,
                                        broadcast_vars, sc._javaAccumulator)
    source = getattr(jvm, DATA_SOURCE_CLASS)(function)
    spark._jsparkSession.dataSource().registerPython(source_class.name(), source)


def driver_includes(env: dict[str, str], includes: list[str]) -> dict[str, str]:
    """``PYTHONPATH`` with the driver's copies of the job's ``--py-files`` archives (``includes``,
    in SparkFiles' folder) ahead of ``env``'s own; nothing when there are none."""
    from pyspark import SparkFiles

    copies = [os.path.join(SparkFiles.getRootDirectory(), name) for name in includes]
    if not copies:
        return {}
    return {"PYTHONPATH": os.pathsep.join([*copies, *filter(None, [env.get("PYTHONPATH")])])}


def registered_environment(spark, name: str):
    """The environment map Spark shares among the queries over the registered format ``name``."""
    source = spark._jsparkSession.sessionState().dataSourceManager().lookupDataSource(name)
    return source.dataSourceCls().envVars()
