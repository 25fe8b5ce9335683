"""Benchmarks and load tests that print figures; they are not tests.

The entry points here are the benchmarks (``python -m loadtest.bench_mqtt``, ...), each built
on ``runner`` (its command line and result lines), ``harness`` (forked workers, CPU sampling)
and ``brokers`` (the brokers measured); ``clients/`` holds the load they generate and
``scenarios/`` what they run; ``locustfile_*.py`` are Locust's."""
