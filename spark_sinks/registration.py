"""Registering a Python data source with a session so that queries running side by side cannot
break each other's tasks.

Spark keeps one environment map per registered Python data source and hands that very map to
every query over the format: the tasks it serialises carry it, and the driver's streaming
source runner adds entries to it when a query starts. With PySpark's own registration it is a
``java.util.HashMap``, which serialised while another query's start adds to it yields bytes that
no longer read back (``java.io.OptionalDataException`` in task deserialisation). Here the map is
a ``ConcurrentHashMap``, whose serialised form stays whole under concurrent writes.
"""

from __future__ import annotations

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
    for name, value in env.items():
        shared_env.put(name, value)
    function = jvm.SimplePythonFunction(bytearray(pickled), shared_env, includes, sc.pythonExec, sc.pythonVer,
                                        broadcast_vars, sc._javaAccumulator)
    source = getattr(jvm, DATA_SOURCE_CLASS)(function)
    spark._jsparkSession.dataSource().registerPython(source_class.name(), source)


def registered_environment(spark, name: str):
    """The environment map Spark shares among the queries over the registered format ``name``."""
    source = spark._jsparkSession.sessionState().dataSourceManager().lookupDataSource(name)
    return source.dataSourceCls().envVars()
