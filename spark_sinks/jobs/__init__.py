"""Example Spark jobs over TideMQ, runnable with ``spark-submit`` and ``python -m``."""
