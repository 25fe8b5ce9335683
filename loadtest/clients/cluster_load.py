"""The load of ``bench_cluster``: MQTT publishers and subscribers spread over the gateway nodes
of a cluster (forked worker processes driven by ``loadtest.clients.mqtt_load``'s pumps), and one
publish/subscribe run on a cluster with its counts, CPU shares and the nodes' metrics before
and after (``run_flow``)."""

from __future__ import annotations

import socket
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from loadtest.clients.mqtt_load import KEEP_ALIVE, Load, pump_publishers
from loadtest.clients.mqtt_load import pump_subscribers as pump_received
from loadtest.clients.mqtt_wire import PublishBatch, Publisher, Subscriber, open_sessions
from loadtest.harness import (
    MACHINE,
    SLACK_S,
    WORKER_WAIT_S,
    CpuSampler,
    Workers,
    deliveries,
    split,
)
from loadtest.scenarios.cluster_nodes import Cluster, Samples, scrape

SUB_PROCS = 2


# -- worker processes ------------------------------------------------------------------------------
# A publisher: (MQTT port, client id, topic, publisher number); the number is the topic's index.
# A subscriber: (MQTT port, client id, topic filter, topic index, node name).
PubSpec = tuple[int, str, str, int]
SubSpec = tuple[int, str, str, int, str]


def publisher_worker(w: Workers, index: int, specs: list[PubSpec], load: Load) -> None:
    """Publishers on any nodes, driven by mqtt_load's pump; reports what each topic got acknowledged."""
    sockets: list[socket.socket] = []
    try:
        pubs: list[Publisher] = []
        by_port: dict[int, list[PubSpec]] = defaultdict(list)
        for spec in specs:
            by_port[spec[0]].append(spec)
        capacity = max(load.window, 256)
        for port, group in by_port.items():
            sessions = open_sessions(port, [s[1] for s in group], keep_alive=KEEP_ALIVE, timeout_s=load.handshake_s)
            sockets += sessions.sockets
            if sessions.error:
                w.report("error", "publisher", index, f"publisher handshake on port {port}: {sessions.error}")
                return
            pubs += [Publisher(sock, PublishBatch(topic, load.qos, number, capacity), load.window)
                     for sock, (_, _, topic, number) in zip(sessions.sockets, group, strict=True)]
        w.report("ready", "publisher", index)
        if not w.go.wait(WORKER_WAIT_S) or w.release.is_set():
            return
        result = pump_publishers(w, pubs, load)
        # what each topic's subscribers are owed: acknowledged at QoS 1, written at QoS 0
        result["acked_by"] = [(p.batch.publisher, p.acked if load.qos else p.sent) for p in pubs]
        w.report("result", "publisher", index, result)
        w.release.wait(WORKER_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the case's error line
        w.report("error", "publisher", index, f"publisher: {type(exc).__name__}: {exc}")
    finally:
        for sock in sockets:
            sock.close()


def subscriber_worker(w: Workers, index: int, specs: list[SubSpec], load: Load, acked: Any) -> None:
    """Subscribers on any nodes, each of one topic; ``acked[topic]``: what its publisher got
    acknowledged, filled in by the coordinator once the publishers are done."""
    sockets: list[socket.socket] = []
    try:
        subs: list[tuple[Subscriber, SubSpec]] = []
        groups: dict[tuple[int, str], list[SubSpec]] = defaultdict(list)
        for spec in specs:
            groups[(spec[0], spec[2])].append(spec)
        for (port, topic_filter), group in groups.items():
            sessions = open_sessions(port, [s[1] for s in group], keep_alive=KEEP_ALIVE, timeout_s=load.handshake_s,
                                     subscribe=(topic_filter, load.qos))
            sockets += sessions.sockets
            if sessions.error:
                w.report("error", "subscriber", index, f"subscriber handshake on port {port}: {sessions.error}")
                return
            subs += [(Subscriber(sock), spec) for sock, spec in zip(sessions.sockets, group, strict=True)]
        w.report("ready", "subscriber", index)
        if not w.go.wait(WORKER_WAIT_S) or w.release.is_set():
            return
        w.report("result", "subscriber", index, pump_subscribers(w, index, subs, load, acked))
        w.release.wait(WORKER_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the case's error line
        w.report("error", "subscriber", index, f"subscriber: {type(exc).__name__}: {exc}")
    finally:
        for sock in sockets:
            sock.close()


def pump_subscribers(w: Workers, index: int, subs: list[tuple[Subscriber, SubSpec]], load: Load,
                     acked: Any) -> dict[str, Any]:
    """mqtt_load's subscriber loop, but complete when each subscriber has its own topic's count;
    plus what each node's subscribers are short of."""

    def complete(_expected: int) -> bool:
        return all(s.counter.unique >= acked[spec[3]] for s, spec in subs)

    result = pump_received(w, index, [s for s, _ in subs], load, complete)
    short: Counter[str] = Counter()
    for s, spec in subs:
        short[spec[4]] += max(0, acked[spec[3]] - s.counter.unique)
    result["short"] = dict(short)
    return result


# -- one publish/subscribe run ---------------------------------------------------------------------
@dataclass(slots=True)
class Outcome:
    published: int
    expected: int
    received: int
    duplicates: int
    rate: float  # deliveries/s
    p50_ms: float
    p99_ms: float
    cpu: str
    cpu_pct: dict[str, float]  # gen, nodes (store node included), gateways, store, other
    us_per_delivery: dict[str, float]  # CPU microseconds per delivery: gen, gateways
    drain: str
    short: dict[str, int]  # node -> messages its subscribers missed
    before: dict[str, Samples]  # node name -> metrics before the first send
    after: dict[str, Samples]


def run_flow(cluster: Cluster, load: Load, topics: int, pubs: list[PubSpec], subs: list[SubSpec]) -> Outcome:
    """Subscribers connect and subscribe, then publishers connect and send; wait for the drain."""
    sub_groups = split(subs, SUB_PROCS)
    w = Workers(len(sub_groups))  # subscribers start first: worker i counts into DELIVERED + i
    acked = w.ctx.Array("q", topics, lock=False)  # per topic; shared with the forked subscribers
    readers = Counter(spec[3] for spec in subs)
    sampler: CpuSampler | None = None
    node_pids = [n.pid for n in cluster.nodes]
    try:
        for group in sub_groups:
            w.start(subscriber_worker, group, load, acked)
        w.collect("subscriber", len(sub_groups), "ready", load.handshake_s + SLACK_S)
        w.start(publisher_worker, pubs, load)
        w.collect("publisher", 1, "ready", load.handshake_s + SLACK_S)
        before = {n.name: scrape(n) for n in cluster.nodes}
        sampler = CpuSampler([*node_pids, *w.pids])
        sampler.start()
        w.go.set()
        results = w.collect("publisher", 1, "result", load.seconds + load.drain_s + SLACK_S)
        for result in results:
            for number, count in result["acked_by"]:
                acked[number] += count
        published = sum(r["acked"] if load.qos else r["sent"] for r in results)
        w.publishers_done(sum(acked[t] * readers[t] for t in range(topics)), load.drain_s)
        got = w.collect("subscriber", len(sub_groups), "result", load.drain_s + SLACK_S)
        sampler.stop()
        after = {n.name: scrape(n) for n in cluster.nodes}
    finally:
        if sampler is not None:
            sampler.stop()
        w.close()
    d = deliveries(results, got, published)
    first_send, last_receive = d.first_send_ns, d.last_receive_ns
    short: Counter[str] = Counter()
    for r in got:
        short.update(r["short"])
    gen = sampler.percent(w.pids, first_send, last_receive)
    nodes = sampler.percent(node_pids, first_send, last_receive)
    store = sampler.percent([cluster.store.pid], first_send, last_receive)
    gateways = sampler.percent([g.pid for g in cluster.gateways], first_send, last_receive)
    other = max(0.0, sampler.percent([MACHINE], first_send, last_receive) - gen - nodes)
    us = {"gen": sampler.us_per_msg(w.pids, first_send, last_receive, d.received),
          "gateways": sampler.us_per_msg([g.pid for g in cluster.gateways], first_send, last_receive, d.received)}
    return Outcome(
        published=published,
        expected=sum(acked[t] * readers[t] for t in range(topics)),
        received=d.received,
        duplicates=d.duplicates,
        rate=d.rate,
        p50_ms=d.p50_ms,
        p99_ms=d.p99_ms,
        cpu=f"gen_cpu_pct={gen:.0f} nodes_cpu_pct={nodes:.0f} store_cpu_pct={store:.0f} other_cpu_pct={other:.0f}",
        cpu_pct={"gen": gen, "nodes": nodes, "gateways": gateways, "store": store, "other": other},
        us_per_delivery=us,
        drain=d.drain,
        short={node: n for node, n in short.items() if n},
        before=before,
        after=after,
    )


def counts(o: Outcome) -> str:
    text = f"published={o.published} expected={o.expected} received={o.received} " \
           f"lost={max(0, o.expected - o.received)} dup={o.duplicates}"
    if o.short:
        text += " lost_by_node=" + ",".join(f"{node}:{n}" for node, n in sorted(o.short.items()))
    return text


def tail(o: Outcome) -> str:
    return f"p50_ms={o.p50_ms:.2f} p99_ms={o.p99_ms:.2f} {o.cpu} drain={o.drain}"
