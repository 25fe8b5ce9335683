"""PySpark side of TideMQ: a streaming data source over store queues and sinks for results."""
