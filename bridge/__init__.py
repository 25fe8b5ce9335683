"""Moves data between TideMQ and the outside world (device streams to Spark, rule connectors)."""
