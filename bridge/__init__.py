"""Moves data between TideMQ and the outside world: the ``tidemq`` Spark source
(``spark_source.py``, the partitions its tasks read ``spark_partitions.py``, its options ``spark_options.py``, and ``data_client.py``, which reads a
gateway's data API or a data directory) and device streams as columns (``decode.py``). The
sink that completes the Spark format is in ``spark_sinks/``, which builds on this package."""
