"""The gateway's HTTP side on the ``--metrics-bind`` listener: Prometheus metrics, probes, the
admin API of ``tidemq ctl``, the data API (Arrow reads, bulk publish, filter holds) and the
dashboard. Built by ``gateway/server.py`` from explicit dependencies (``deps.py``)."""
