"""The Prometheus collector behind ``/metrics`` (served by ``app.py``): every ``tidemq_*``
metric but the data API's publishing counters (``data_publish.py``).

Nothing is counted for the metrics themselves: the gateways keep plain counters
(``ProtocolStats``), the store its latency histograms and gauges, and the collector reads them
all when Prometheus scrapes -- so the hot paths pay nothing for a registry. Labels are bounded:
protocols, and for queue lag the ``TOP_QUEUES`` longest queues or groups only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from store import LatencyHistogram

if TYPE_CHECKING:
    from store import MessageStore

    from ..auth.authorize import Authorizer
    from ..core.timer import TimerService
    from ..pressure import StorePressure
    from ..stats import ProtocolStats
    from ..trace import Tracer
    from .deps import Brokers, ClusterParts, ProtocolGateway, Status

TOP_QUEUES = 20  # queues (AMQP) and consumer groups (remoting) with the longest backlog


def histogram_buckets(histogram: LatencyHistogram) -> list[tuple[str, int]]:
    """A store histogram's cumulative buckets as Prometheus names them."""
    return [("+Inf" if bound == float("inf") else repr(bound), count) for bound, count in histogram.cumulative()]


def _histogram(name: str, documentation: str, histogram: LatencyHistogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, buckets=histogram_buckets(histogram), sum_value=histogram.sum)


class GatewayCollector:
    """A prometheus-client custom collector over one running gateway's parts."""

    def __init__(self, brokers: Brokers, store: MessageStore | None, *, authorizer: Authorizer, status: Status,
                 pressure: StorePressure | None, tracer: Tracer | None, cluster: ClusterParts,
                 timer: TimerService | None = None) -> None:
        self.brokers = brokers
        self.store = store
        self.authorizer = authorizer
        self.status = status
        self.pressure = pressure
        self.tracer = tracer
        self.cluster = cluster
        self.timer = timer

    def describe(self) -> list[Metric]:
        return []  # collected on each scrape only

    def collect(self) -> Iterator[Metric]:
        yield from self._protocols()
        yield from self._store()
        yield from self._cache()
        yield from self._trace()
        yield from self._timer()
        yield from self._cluster()
        yield from self._replication()
        yield from self._backlogs()

    def _protocol_stats(self) -> Iterator[tuple[str, ProtocolGateway, ProtocolStats]]:
        for name, broker in self.brokers.running():
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
        for (protocol, action), count in sorted(self.authorizer.stats.denied.items()):
            denied.add_metric([protocol, action], count)
        yield denied
        mqtt = self.brokers.mqtt
        if mqtt is not None:
            yield GaugeMetricFamily("tidemq_mqtt_sessions", "MQTT sessions (connected and persistent)",
                                    value=len(mqtt.sessions))
            refused = CounterMetricFamily("tidemq_mqtt_shared_subscriptions_refused",
                                          "$share subscriptions a node cannot honour (a gateway node of a "
                                          "cluster), refused or taken from a resumed session", labels=["cause"])
            for cause in ("subscribe", "resumed"):
                refused.add_metric([cause], mqtt.shared_refusal.counts[cause])
            yield refused

    def _store(self) -> Iterator[Metric]:
        store = self.store
        if store is None:
            return
        yield _histogram("tidemq_store_put_latency_seconds", "Store puts, submit to durable per the flush mode",
                         store.put_latency)
        yield _histogram("tidemq_store_get_latency_seconds", "Store reads (index and commitlog)", store.get_latency)
        yield _histogram("tidemq_store_memory_release_seconds", "Returns of free malloc pages to the system",
                         store.memory_release_latency)
        yield GaugeMetricFamily("tidemq_commitlog_bytes", "Commitlog bytes kept (after retention)",
                                value=store.commitlog.end_position - store.commitlog.min_position)
        yield GaugeMetricFamily("tidemq_dispatch_lag_bytes", "Commitlog bytes not yet in the consume-queue index",
                                value=store.dispatch_lag_bytes)
        yield GaugeMetricFamily("tidemq_store_backlog_messages", "Messages submitted to the store, not yet durable",
                                value=store.backlog)
        yield GaugeMetricFamily("tidemq_queues", "Store queues created", value=store.queue_count)
        yield CounterMetricFamily("tidemq_queues_reclaimed", "Idle light queues removed (no new message, no reader)",
                                  value=store.reclaimer.removed_total)
        yield GaugeMetricFamily("tidemq_store_memtable_bytes", "Memory in RocksDB write buffers (index, metadata)",
                                value=store.memtable_bytes)
        yield GaugeMetricFamily("tidemq_store_block_cache_bytes", "Memory in RocksDB's block cache (index, metadata)",
                                value=store.block_cache_bytes)
        yield CounterMetricFamily("tidemq_notify_events", "Notify events (queue has new data) sent to gateways",
                                  value=store.notify.events_published)
        yield GaugeMetricFamily("tidemq_event_loop_lag_seconds", "How late the event loop last ran a 0.5 s timer",
                                value=self.status.loop_lag_s)
        pressure = self.pressure
        yield GaugeMetricFamily("tidemq_resource_alarm", "1 while publishers are blocked (disk or store backlog)",
                                value=1 if pressure is not None and pressure.raised else 0)

    def _cache(self) -> Iterator[Metric]:
        caches = {id(c): c for _, b, _ in self._protocol_stats() if (c := getattr(b, "cache", None))}
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

    def _timer(self) -> Iterator[Metric]:
        timer = self.timer
        if timer is None:
            return
        yield GaugeMetricFamily("tidemq_timer_pending", "Timer messages stored and not yet due", value=timer.pending)
        yield CounterMetricFamily("tidemq_timer_released", "Timer messages released into their queues",
                                  value=timer.released)
        yield _histogram("tidemq_timer_due_lag_seconds", "How late timer messages were released", timer.due_lag)
        due = GaugeMetricFamily("tidemq_timer_due_within", "Pending timer messages due within the next "
                                "seconds (counted over the first 100,000 due)", labels=["seconds"])
        for bound, count in timer.due_within():
            due.add_metric([f"{bound:g}"], count)
        yield due

    def _trace(self) -> Iterator[Metric]:
        tracer = self.tracer
        if tracer is None:
            return
        yield CounterMetricFamily("tidemq_trace_rows_written",
                                  "Message trace rows written (one per publish, delivery and ack)",
                                  value=tracer.rows_written)
        yield CounterMetricFamily("tidemq_trace_rows_dropped", "Message trace rows dropped (the writer was behind)",
                                  value=tracer.rows_dropped)
        yield GaugeMetricFamily("tidemq_trace_rows_pending", "Message trace rows not yet written",
                                value=tracer.pending)

    def _replication(self) -> Iterator[Metric]:
        replica = self.cluster.replica
        if replica is None:
            return
        status = replica.status()
        yield GaugeMetricFamily("tidemq_replication_leader", "1 while this store node leads its group",
                                value=1 if status["role"] == "leader" else 0)
        yield GaugeMetricFamily("tidemq_replication_epoch", "The newest epoch this store node's log holds",
                                value=replica.epoch)
        in_sync = status.get("in_sync")
        if isinstance(in_sync, list):
            yield GaugeMetricFamily("tidemq_replication_in_sync_replicas",
                                    "Replicas in sync, the leader among them", value=1 + len(in_sync))
        followers = status.get("followers")
        if isinstance(followers, dict):
            lag_bytes = GaugeMetricFamily("tidemq_replication_follower_lag_bytes",
                                          "Commitlog bytes a follower lacks", labels=["follower"])
            lag_s = GaugeMetricFamily("tidemq_replication_follower_lag_seconds",
                                      "How long a follower has been behind", labels=["follower"])
            for name, follower in sorted(followers.items()):
                lag_bytes.add_metric([name], follower["lag_bytes"])
                lag_s.add_metric([name], follower["lag_s"])
            yield lag_bytes
            yield lag_s

    def _cluster(self) -> Iterator[Metric]:
        service = self.cluster.store_service
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
        node = self.cluster.node
        lookup = node.lookup if node.lookup is not None else self.cluster.store_lookup
        if lookup is not None:
            lookup_stats = lookup.stats
            yield CounterMetricFamily("tidemq_lookup_calls", "Lookups of where a client or a queue's readers are",
                                      value=lookup_stats.lookups)
            doubt = CounterMetricFamily("tidemq_lookup_in_doubt",
                                        "Lookup answers in doubt (notify broadcast, takeover asked everywhere)",
                                        labels=["reason"])
            for reason, count in sorted(lookup_stats.broadcast_fallbacks.items()):
                doubt.add_metric([reason], count)
            yield doubt
        sent = node.takeovers
        if sent is not None:
            takeovers = CounterMetricFamily("tidemq_takeovers", "Client takeovers sent to other gateway nodes",
                                            labels=["how"])
            for how, count in sorted(sent.items()):
                takeovers.add_metric([how], count)
            yield takeovers
        if self.cluster.relay_counts:  # a gateway node's RocketMQ clients, at store failovers
            relayed = CounterMetricFamily("tidemq_rocketmq_failover_requests",
                                          "RocketMQ requests a gateway node sent again to a new store leader, "
                                          "answered as lost with the old one, or refused for want of one",
                                          labels=["protocol", "outcome"])
            for protocol, counts in sorted(self.cluster.relay_counts.items()):
                for outcome, count in counts.items():
                    relayed.add_metric([protocol, outcome], count)
            yield relayed
        link = self.cluster.gateway_store
        if link is not None:  # a gateway node: what its store link carried
            yield CounterMetricFamily("tidemq_store_link_reads", "Reads of queues from the store node",
                                      value=link.fetches)
            yield CounterMetricFamily("tidemq_notify_events_received", "Notify events received from the store node",
                                      value=link.notify_events)

    def _backlogs(self) -> Iterator[Metric]:
        amqp = self.brokers.amqp
        if amqp is not None:
            family = GaugeMetricFamily("tidemq_amqp_queue_messages",
                                       f"Ready messages of the {TOP_QUEUES} longest AMQP queues", labels=["queue"])
            ready = sorted(((q.ready_count(), name) for name, q in amqp.queues.items()), reverse=True)
            for count, name in ready[:TOP_QUEUES]:
                family.add_metric([name], count)
            yield family
        remoting = self.brokers.remoting
        store = self.store
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
            yield CounterMetricFamily("tidemq_remoting_pop_revived", "Popped messages not acked in their invisible "
                                      "time, made visible again", value=remoting.pop.revived)
            yield CounterMetricFamily("tidemq_remoting_pop_dead_lettered", "Popped messages past the max reconsume "
                                      "times, stored into %DLQ%{group}", value=remoting.pop.dead_lettered)
