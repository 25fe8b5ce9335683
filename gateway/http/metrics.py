"""The metrics listener (``--metrics-bind``): Prometheus metrics at ``/metrics``, ``/healthz``
(the process answers), ``/readyz`` (the store is open and every listener is up) and the admin
API of ``tidemq ctl`` under ``/admin/`` (``gateway/http/admin.py``).

Nothing is counted for the metrics themselves: the gateways keep plain counters
(``ProtocolStats``), the store its latency histograms and gauges, and the collector reads them
all when Prometheus scrapes -- so the hot paths pay nothing for a registry. Labels are bounded:
protocols, and for queue lag the ``TOP_QUEUES`` longest queues or groups only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from store.stats import LatencyHistogram

from . import admin, dashboard, data_access, data_api

if TYPE_CHECKING:
    from ..server import Gateway

log = logging.getLogger("tidemq.metrics")

TOP_QUEUES = 20  # queues (AMQP) and consumer groups (remoting) with the longest backlog


def _histogram(name: str, documentation: str, histogram: LatencyHistogram) -> HistogramMetricFamily:
    buckets = [("+Inf" if bound == float("inf") else repr(bound), count) for bound, count in histogram.cumulative()]
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=histogram.sum)


class GatewayCollector:
    """A prometheus-client custom collector over one running gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def describe(self) -> list[Metric]:
        return []  # collected on each scrape only

    def collect(self) -> Iterator[Metric]:
        yield from self._protocols()
        yield from self._store()
        yield from self._cache()
        yield from self._trace()
        yield from self._cluster()
        yield from self._backlogs()

    def _protocol_stats(self):
        gw = self.gateway
        for name, broker in (("mqtt", gw.mqtt), ("amqp", gw.amqp), ("remoting", gw.remoting)):
            if broker is not None:
                yield name, broker, broker.stats

    def _protocols(self) -> Iterator[Metric]:
        connections = GaugeMetricFamily("tidemq_connections", "Open client connections", labels=["protocol"])
        accepted = CounterMetricFamily("tidemq_connections_accepted", "Connections accepted since start",
                                       labels=["protocol"])
        received = CounterMetricFamily("tidemq_messages_received", "Messages accepted from clients",
                                       labels=["protocol"])
        sent = CounterMetricFamily("tidemq_messages_sent", "Messages delivered to clients", labels=["protocol"])
        bytes_in = CounterMetricFamily("tidemq_bytes_received", "Bytes read from clients", labels=["protocol"])
        bytes_out = CounterMetricFamily("tidemq_bytes_sent", "Bytes written to clients", labels=["protocol"])
        dropped = CounterMetricFamily("tidemq_messages_dropped",
                                      "QoS 0 messages skipped for slow consumers or over a client's size limit",
                                      labels=["protocol"])
        auth = CounterMetricFamily("tidemq_auth_failures", "Logins refused", labels=["protocol"])
        for name, broker, stats in self._protocol_stats():
            connections.add_metric([name], len(broker.connections))
            accepted.add_metric([name], stats.connections_total)
            received.add_metric([name], stats.messages_received)
            sent.add_metric([name], stats.messages_sent)
            bytes_in.add_metric([name], stats.bytes_received)
            bytes_out.add_metric([name], stats.bytes_sent)
            dropped.add_metric([name], stats.publish_dropped)
            auth.add_metric([name], stats.auth_failures)
        yield from (connections, accepted, received, sent, bytes_in, bytes_out, dropped, auth)
        denied = CounterMetricFamily("tidemq_authorization_denied", "Operations refused by the ACL or AMQP "
                                     "permissions (gateway/auth/authorize.py)", labels=["protocol", "action"])
        for (protocol, action), count in sorted(self.gateway.authorizer.stats.denied.items()):
            denied.add_metric([protocol, action], count)
        yield denied
        mqtt = self.gateway.mqtt
        if mqtt is not None:
            yield GaugeMetricFamily("tidemq_mqtt_sessions", "MQTT sessions (connected and persistent)",
                                    value=len(mqtt.sessions))

    def _store(self) -> Iterator[Metric]:
        store = self.gateway.store
        if store is None:
            return
        yield _histogram("tidemq_store_put_latency_seconds", "Store puts, submit to durable per the flush mode",
                         store.put_latency)
        yield _histogram("tidemq_store_get_latency_seconds", "Store reads (index and commitlog)", store.get_latency)
        yield GaugeMetricFamily("tidemq_commitlog_bytes", "Commitlog bytes kept (after retention)",
                                value=store.commitlog.end_position - store.commitlog.min_position)
        yield GaugeMetricFamily("tidemq_dispatch_lag_bytes", "Commitlog bytes not yet in the consume-queue index",
                                value=store.dispatch_lag_bytes)
        yield GaugeMetricFamily("tidemq_store_backlog_messages", "Messages submitted to the store, not yet durable",
                                value=store.backlog)
        yield GaugeMetricFamily("tidemq_queues", "Store queues created", value=store.queue_count)
        yield GaugeMetricFamily("tidemq_store_memtable_bytes", "Memory in RocksDB write buffers (index, metadata)",
                                value=store.memtable_bytes)
        yield CounterMetricFamily("tidemq_notify_events", "Notify events (queue has new data) sent to gateways",
                                  value=store.notify.events_published)
        yield GaugeMetricFamily("tidemq_event_loop_lag_seconds", "How late the event loop last ran a 0.5 s timer",
                                value=self.gateway.loop_lag_s)
        pressure = self.gateway.pressure
        yield GaugeMetricFamily("tidemq_resource_alarm", "1 while publishers are blocked (disk or store backlog)",
                                value=1 if pressure is not None and pressure.raised else 0)

    def _cache(self) -> Iterator[Metric]:
        caches = {id(b.cache): b.cache for _, b, _ in self._protocol_stats() if getattr(b, "cache", None)}
        if not caches:
            return
        hits = sum(c.stats.hits for c in caches.values())
        misses = sum(c.stats.misses for c in caches.values())
        yield CounterMetricFamily("tidemq_queue_cache_hits", "Messages served from the queue cache", value=hits)
        yield CounterMetricFamily("tidemq_queue_cache_misses", "Messages the queue cache read from the store",
                                  value=misses)
        yield GaugeMetricFamily("tidemq_queue_cache_hit_ratio", "Hits / (hits + misses) since start",
                                value=hits / (hits + misses) if hits + misses else 0.0)
        yield GaugeMetricFamily("tidemq_queue_cache_bytes", "Memory the queue cache accounts for",
                                value=sum(c.stats.bytes for c in caches.values()))

    def _trace(self) -> Iterator[Metric]:
        tracer = self.gateway.tracer
        if tracer is None:
            return
        yield CounterMetricFamily("tidemq_trace_rows_written",
                                  "Message trace rows written (one per publish, delivery and ack)",
                                  value=tracer.rows_written)
        yield CounterMetricFamily("tidemq_trace_rows_dropped", "Message trace rows dropped (the writer was behind)",
                                  value=tracer.rows_dropped)
        yield GaugeMetricFamily("tidemq_trace_rows_pending", "Message trace rows not yet written",
                                value=tracer.pending)

    def _cluster(self) -> Iterator[Metric]:
        service = self.gateway.store_service
        if service is not None:  # a store node: how its notify events were routed
            stats = service.router.stats
            yield GaugeMetricFamily("tidemq_cluster_gateway_nodes", "Gateway nodes linked to this store node",
                                    value=len(service.router.nodes))
            yield CounterMetricFamily("tidemq_notify_messages_sent", "NOTIFY messages sent to gateway nodes",
                                      value=stats.messages)
            routed = CounterMetricFamily("tidemq_notify_events_routed", "Notify events by how they were routed",
                                         labels=["how"])
            routed.add_metric(["targeted"], stats.targeted)
            routed.add_metric(["broadcast"], stats.broadcast)
            yield routed
            fallbacks = CounterMetricFamily("tidemq_notify_broadcast_fallbacks",
                                            "Notify events broadcast because the lookup could not say where",
                                            labels=["reason"])
            for reason, count in sorted(stats.fallbacks.items()):
                fallbacks.add_metric([reason], count)
            yield fallbacks
        node = self.gateway.node
        lookup = node.lookup if node is not None else self.gateway.store_lookup
        if lookup is not None:
            stats = lookup.stats
            yield CounterMetricFamily("tidemq_lookup_calls", "Lookups of where a client or a queue's readers are",
                                      value=stats.lookups)
            doubt = CounterMetricFamily("tidemq_lookup_in_doubt",
                                        "Lookup answers in doubt (notify broadcast, takeover asked everywhere)",
                                        labels=["reason"])
            for reason, count in sorted(stats.broadcast_fallbacks.items()):
                doubt.add_metric([reason], count)
            yield doubt
        if node is not None:
            takeovers = CounterMetricFamily("tidemq_takeovers", "Client takeovers sent to other gateway nodes",
                                            labels=["how"])
            for how, count in sorted(node.takeovers.items()):
                takeovers.add_metric([how], count)
            yield takeovers
        store = self.gateway.gateway_store
        if store is not None:  # a gateway node: what its store link carried
            yield CounterMetricFamily("tidemq_store_link_reads", "Reads of queues from the store node",
                                      value=store.fetches)
            yield CounterMetricFamily("tidemq_notify_events_received", "Notify events received from the store node",
                                      value=store.notify_events)

    def _backlogs(self) -> Iterator[Metric]:
        amqp = self.gateway.amqp
        if amqp is not None:
            family = GaugeMetricFamily("tidemq_amqp_queue_messages",
                                       f"Ready messages of the {TOP_QUEUES} longest AMQP queues", labels=["queue"])
            ready = sorted(((q.ready_count(), name) for name, q in amqp.queues.items()), reverse=True)
            for count, name in ready[:TOP_QUEUES]:
                family.add_metric([name], count)
            yield family
        remoting = self.gateway.remoting
        store = self.gateway.store
        if remoting is not None and store is not None:
            family = GaugeMetricFamily("tidemq_remoting_consumer_lag",
                                       f"Messages not yet consumed, for the {TOP_QUEUES} most behind online groups",
                                       labels=["group"])
            lags = []
            for group in list(remoting.groups.groups):
                lags.append((remoting.group_lag(group), group))
            for lag, group in sorted(lags, reverse=True)[:TOP_QUEUES]:
                family.add_metric([group], lag)
            yield family


class MetricsServer:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GatewayCollector(gateway))  # type: ignore[arg-type]
        app = web.Application(middlewares=[self._admin_guard])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/admin/clients", self._clients)
        for view in (admin.sessions, admin.subscriptions):
            app.router.add_get(f"/admin/{view.__name__}", self._view(view))
        app.router.add_get("/admin/queues", self._queues)
        app.router.add_get("/admin/messages", self._messages)
        app.router.add_post("/admin/kick", self._kick)
        publish = data_api.add_routes(app, gateway)  # /data/: bulk reads as Arrow, and publishing (data_api.py)
        self.registry.register(publish.collector())  # type: ignore[arg-type]  # tidemq_data_publish_*
        dashboard.add_routes(app, gateway)  # /dashboard and the /admin/overview it polls
        app.router.add_get("/admin/trace", self._trace)
        self._runner = web.AppRunner(app, access_log=None)
        self._site: web.TCPSite | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port)
        await self._site.start()
        server = self._site._server  # the bound address (port 0 picks one)
        sock = server.sockets[0]  # type: ignore[union-attr]
        return sock.getsockname()[:2]

    async def stop(self) -> None:
        await self._runner.cleanup()

    # -- admin (tidemq ctl) ---------------------------------------------------------------------
    @web.middleware
    async def _admin_guard(self, request: web.Request, handler):
        if request.path.startswith(("/admin/", "/data/")):
            token = self.gateway.config.admin_token
            data = request.path.startswith("/data/")  # (also a user's Basic credentials: data_access.py)
            if not data and token and request.headers.get("Authorization") != f"Bearer {token}":
                return web.json_response({"error": "a valid admin token is needed"}, status=401)
            try:
                if data:
                    request[data_access.PRINCIPAL] = await data_access.authenticate(request, self.gateway)
                return await handler(request)
            except admin.AdminError as exc:
                return web.json_response({"error": str(exc)}, status=exc.status)
        return await handler(request)

    def _view(self, view):
        async def handler(request: web.Request) -> web.Response:
            return await self._json(view(self.gateway))
        return handler

    @staticmethod
    async def _json(data) -> web.Response:
        return web.json_response(data, dumps=lambda d: json.dumps(d, default=str))

    async def _clients(self, request: web.Request) -> web.Response:
        client_id = request.query.get("id")
        if client_id:
            return await self._json(await admin.locate_client(self.gateway, client_id))
        return await self._json(admin.clients(self.gateway))

    async def _queues(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            raise admin.AdminError(400, "limit must be a number") from None
        return await self._json(admin.queues(self.gateway, request.query.get("prefix", ""), limit))

    async def _messages(self, request: web.Request) -> web.Response:
        q = request.query
        return await self._json(await admin.find_messages(self.gateway, key=q.get("key"), topic=q.get("topic"),
                                                          msg_id=q.get("msg_id")))

    async def _trace(self, request: web.Request) -> web.Response:
        q = request.query
        return await self._json(admin.trace(self.gateway, msg_id=q.get("msg_id"), key=q.get("key")))

    async def _kick(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            protocol, client = str(body["protocol"]), str(body["client"])
        except (ValueError, KeyError, TypeError):
            raise admin.AdminError(400, 'send {"protocol": ..., "client": ...}') from None
        return await self._json(admin.kick(self.gateway, protocol, client))

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        problem = self.gateway.not_ready()
        if problem:
            return web.Response(status=503, text=f"not ready: {problem}\n")
        return web.Response(text="ready\n")
