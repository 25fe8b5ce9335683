"""Cluster benchmark: notify routing and the queue cache of gateway nodes, one store node.

    python -m loadtest.bench_cluster [--quick] [--scenarios spread,fanout,fanout_nodes] [--nodes 2,4,8]
                                     [--fanout-nodes 1,2,4] [--fanout-qos 0,1] [--out FILE] [--keep-logs DIR]

Each case starts a fresh cluster of real processes on 127.0.0.1 (``python -m gateway serve``:
one ``--role store`` node, ``--flush async``, and N ``--role gateway`` nodes, each with its
metrics listener; ``TIDEMQ_*`` variables of the caller's environment are not passed on) and
stops every process of it by PID at its end, on errors too. The load is bench_mqtt's: raw-socket
MQTT 3.1.1 clients in forked worker processes (``loadtest.clients.mqtt_wire``), QoS 1 (fanout_nodes: QoS 0
and 1), 64-byte payloads.

- spread, for N in 2, 4, 8 and for each notify routing of the store node (``targeted``: only to
  the nodes that said they read the queue -- by their hints: ``serve --role store`` has no
  lookup yet; ``broadcast``: every event to every node, ``TIDEMQ_NOTIFY_ROUTING=broadcast``):
  200 topics ``bench/spread/T``, each read by 2 subscribers on 2 different nodes (T mod N and
  another one), so a topic is read on 2 of the N nodes; one publisher per topic, on node
  (T + N/2) mod N, each with 20 PUBLISHes unacknowledged and at most 100 messages ahead of its
  subscribers; 10 s of publishing.
- fanout, with the queue cache of the gateway nodes on (64 MiB) and off
  (``TIDEMQ_QUEUE_CACHE_BYTES=0``): 2 gateway nodes, 2,000 subscribers of one topic on the
  first, one publisher on the second, up to 2,000 messages in 15 s, at most 20,000 deliveries
  ahead of the subscribers (bench_mqtt's fan-out, across two nodes); the subscribers may take
  up to 120 s after the last send to drain. With the cache off, each store read serves one
  subscriber and wakes all 2,000 (``QueueCache.offer`` holds an answer for one read): on 2 cores
  they drain a few hundred deliveries/s, so the publisher's bound holds it to a dozen messages
  and the drain takes 30-50 s.
- fanout_nodes, for N in 1, 2, 4 and QoS 0 and 1: does fan-out scale with gateway nodes? One
  topic, 1,000 subscribers in all, spread evenly over the N nodes (subscriber i on node i mod N),
  one publisher on the first node, unpaced for 10 s but at most 150,000 deliveries ahead of the
  subscribers, who read every 50 ms (bench_mqtt's fan-out: 20,000 and 20 ms; here the load
  generator is made lighter, as it shares the cores with the nodes, and the window wide enough
  not to pace 4 nodes: see FANOUT_NODES_POLL_S). When both N = 1 and N = 4 ran, a
  final ``# fanout_nodes scaling qos=Q: 4 nodes / 1 node = X.XX (...)`` line per QoS divides their
  deliveries/s. On 2 cores the ceiling is the cores: read it with the CPU figures. The line
  also gives the gateway nodes' CPU per delivery on 1 and on 4 nodes (what the cluster itself
  adds), the load generator's, and the bound of the cores: the most 4 nodes could reach, as a
  multiple of 1 node, if a delivery cost them no more than it costs one node -- 1 node has a
  core of its own while the generator runs on the other; 4 nodes share both with it.

``--quick``: spread with N in 2 and 4, 100 topics, 3 s; fanout with 500 subscribers and 500
messages in 5 s, drain up to 60 s; fanout_nodes with N in 1 and 4, 400 subscribers, 5 s (its
lines say ``quick=1``; 45 s in all on 2 cores without fanout_nodes, which takes 27 s). The full
run took 161 s on 2 cores without fanout_nodes (72 s more), a third of it the fan-out with the
cache off. One line per case:

    cluster scenario=spread nodes=N routing=targeted|broadcast topics=200 readers_per_topic=2 seconds=10
        deliveries_per_s=... published=... expected=... received=... lost=... dup=...
        notify_msgs_per_publish=... notify_events_per_publish=... broadcast_share=... p50_ms=... p99_ms=...
        gen_cpu_pct=... nodes_cpu_pct=... store_cpu_pct=... other_cpu_pct=... drain=... node_complaints=...
    cluster scenario=fanout subscribers=2000 cache=on|off store_reads_per_publish=... deliveries_per_s=...
        cache_hit_ratio=... published=... expected=... received=... lost=... dup=... (then as above)
    cluster scenario=fanout_nodes nodes=N qos=Q subscribers=1000 deliveries_per_s=... published=...
        expected=... received=... lost=... dup=... node_cpu_us_per_delivery=... gen_cpu_us_per_delivery=...
        p50_ms=... p99_ms=... gen_cpu_pct=... nodes_cpu_pct=... store_cpu_pct=... other_cpu_pct=...
        drain=... node_complaints=...
    cluster scenario=... error="..."        (the case failed; the run goes on)

What the figures are (node metrics are differences between a scrape just before the first
send and one after the subscribers stopped):

- ``published``: PUBLISHes the nodes acknowledged (QoS 0: the publisher wrote);
  ``expected`` = published x readers;
  ``received`` counts distinct messages at the subscribers, ``dup`` duplicates,
  ``lost`` = expected - received once the subscribers stopped (at QoS 0: dropped, e.g. a
  subscriber more than ``mqtt_max_queued_messages`` behind). ``deliveries_per_s``: received
  over first send to last receive. ``drain``: as in bench_mqtt (``complete``: everything
  arrived; ``idle``: nothing for 2 s after the publishers were done: what is missing was
  dropped; ``timeout``: still arriving at the drain timeout, 10 s after the last send, 120 s in
  the fan-out: what is missing had not arrived yet). When something is missing, a
  ``lost_by_node`` field names the nodes whose subscribers missed messages.
- ``notify_msgs_per_publish``: the store node's ``tidemq_notify_messages_sent_total`` (one
  NOTIFY per node per coalesced batch) / published. ``notify_events_per_publish``: the
  (queue, offset) events the gateway nodes received, summed over the nodes
  (``tidemq_notify_events_received_total``) / published: what each node had to look at.
  ``broadcast_share``: of the events the store node routed, the share sent to every node
  (``tidemq_notify_events_routed_total{how}``).
- ``store_reads_per_publish``: the subscribers' node's ``tidemq_store_link_reads_total`` /
  published; ``cache_hit_ratio``: its ``tidemq_queue_cache_hits_total`` / (hits + misses).
- ``gen_cpu_pct``: the load generator's processes; ``nodes_cpu_pct``: all cluster processes
  (store node included) -- in fanout_nodes the gateway nodes only, summed (so above 100 with
  several nodes) --, ``store_cpu_pct``: the store node alone; ``other_cpu_pct``: the rest
  of the machine; 100 is one core. ``node_complaints``: warning and error lines (and
  tracebacks) the nodes logged during the case; the first of them follows as a ``#`` line.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loadtest import runner
from loadtest.bench_mqtt import FANOUT_AHEAD_DELIVERIES, FANOUT_POLL_S
from loadtest.brokers import ScenarioError, raise_fd_limit
from loadtest.clients.cluster_load import Outcome, PubSpec, SubSpec, counts, run_flow, tail
from loadtest.clients.mqtt_load import Load
from loadtest.harness import parse_list, quote
from loadtest.scenarios.cluster_nodes import Cluster, complaints, delta, start_cluster, stop_cluster

SCENARIOS = ("spread", "fanout", "fanout_nodes")
SPREAD_READERS = 2  # nodes reading each topic (one subscriber on each)
SPREAD_WINDOW = 20  # unacknowledged PUBLISHes per spread publisher
SPREAD_AHEAD = 100  # messages a spread publisher may be ahead of its topic's average subscriber
SPREAD_POLL_S = 0.005  # hundreds of subscriber sockets per process: read every 5 ms
# fanout_nodes: the generator shares the 2 cores with 4 nodes, so each of its cycles is one the
# nodes lack. Its subscribers read every 50 ms (bench_mqtt's fan-out: 20 ms), so a read brings
# ~2.5x the messages; measured at 4 nodes, QoS 1: 1.85 -> 1.21 us of generator CPU per delivery.
# The publisher sees the subscribers' progress about once a read, so its bound on deliveries
# ahead is also a bound on the pace: with 20,000 (bench_mqtt's) or 60,000, the 4 nodes at QoS 0
# waited on it, the cores at most 183 % busy; with 150,000 they use the cores (194 %). The
# latencies of this scenario are then the time a message waits in that window (p50 70-830 ms),
# not the cluster's delivery latency (bench_mqtt's latency scenario measures that).
FANOUT_NODES_POLL_S = 0.05
FANOUT_NODES_AHEAD_DELIVERIES = 150_000


# -- what to run -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Plan:
    quick: bool
    nodes: tuple[int, ...] = (2, 4, 8)
    spread_topics: int = 200
    spread_seconds: float = 10.0
    fanout_subscribers: int = 2000
    fanout_messages: int = 2000
    fanout_seconds: float = 15.0
    # With the cache off, 2,000 subscribers drain a dozen messages in ~50 s here (see above):
    # the drain must outlast that for store_reads_per_publish to count every read.
    fanout_drain_s: float = 120.0
    fanout_nodes: tuple[int, ...] = (1, 2, 4)  # gateway node counts of fanout_nodes
    fanout_nodes_subscribers: int = 1000  # in all, spread evenly over the nodes
    fanout_nodes_seconds: float = 10.0
    fanout_nodes_qos: tuple[int, ...] = (0, 1)
    drain_s: float = 10.0
    handshake_s: float = 60.0


FULL = Plan(quick=False)
QUICK = replace(FULL, quick=True, nodes=(2, 4), spread_topics=100, spread_seconds=3.0, fanout_subscribers=500,
                fanout_messages=500, fanout_seconds=5.0, fanout_drain_s=60.0, fanout_nodes=(1, 4),
                fanout_nodes_subscribers=400, fanout_nodes_seconds=5.0, drain_s=5.0, handshake_s=30.0)


# -- scenarios -------------------------------------------------------------------------------------
def spread(cluster: Cluster, plan: Plan) -> str:
    n = len(cluster.gateways)
    topics = plan.spread_topics
    gateways = cluster.gateways
    subs: list[SubSpec] = []
    pubs: list[PubSpec] = []
    for t in range(topics):
        topic = f"bench/spread/{t}"
        # 2 different nodes per topic, the pairs varied: t mod N and 1..N-1 further on
        first = t % n
        second = (first + 1 + (t // n) % (n - 1)) % n
        for k, node in enumerate((first, second)[:SPREAD_READERS]):
            g = gateways[node]
            subs.append((g.port, f"bench-spread-sub-{t}-{k}", topic, t, g.name))
        pubs.append((gateways[(t + n // 2) % n].port, f"bench-spread-pub-{t}", topic, t))
    load = Load(qos=1, topic_filter="", window=SPREAD_WINDOW, seconds=plan.spread_seconds, drain_s=plan.drain_s,
                handshake_s=plan.handshake_s, ahead=SPREAD_AHEAD, publishers=topics, subscribers=SPREAD_READERS,
                poll_s=SPREAD_POLL_S)
    o = run_flow(cluster, load, topics, pubs, subs)
    store_before, store_after = o.before["store"], o.after["store"]
    notify_msgs = delta(store_before, store_after, "tidemq_notify_messages_sent_total")
    targeted = delta(store_before, store_after, "tidemq_notify_events_routed_total", how="targeted")
    broadcast = delta(store_before, store_after, "tidemq_notify_events_routed_total", how="broadcast")
    received_events = sum(delta(o.before[g.name], o.after[g.name], "tidemq_notify_events_received_total")
                          for g in gateways)
    per = max(1, o.published)
    return (f"topics={topics} readers_per_topic={SPREAD_READERS} seconds={plan.spread_seconds:g} "
            f"deliveries_per_s={o.rate:.0f} {counts(o)} notify_msgs_per_publish={notify_msgs / per:.3f} "
            f"notify_events_per_publish={received_events / per:.3f} "
            f"broadcast_share={broadcast / max(1.0, targeted + broadcast):.3f} {tail(o)}")


def fanout(cluster: Cluster, plan: Plan) -> str:
    n = plan.fanout_subscribers
    reader, writer = cluster.gateways[0], cluster.gateways[1]
    topic = "bench/cluster/fanout"
    subs: list[SubSpec] = [(reader.port, f"bench-fanout-sub-{i}", topic, 0, reader.name) for i in range(n)]
    pubs: list[PubSpec] = [(writer.port, "bench-fanout-pub", topic, 0)]
    load = Load(qos=1, topic_filter="", window=100, seconds=plan.fanout_seconds, drain_s=plan.fanout_drain_s,
                handshake_s=plan.handshake_s, max_messages=plan.fanout_messages,
                ahead=max(1, FANOUT_AHEAD_DELIVERIES // n), publishers=1, subscribers=n, poll_s=FANOUT_POLL_S)
    o = run_flow(cluster, load, 1, pubs, subs)
    before, after = o.before[reader.name], o.after[reader.name]
    reads = delta(before, after, "tidemq_store_link_reads_total")
    hits = delta(before, after, "tidemq_queue_cache_hits_total")
    misses = delta(before, after, "tidemq_queue_cache_misses_total")
    return (f"store_reads_per_publish={reads / max(1, o.published):.3f} deliveries_per_s={o.rate:.0f} "
            f"cache_hit_ratio={hits / max(1.0, hits + misses):.3f} {counts(o)} {tail(o)}")


def fanout_nodes(cluster: Cluster, plan: Plan, qos: int) -> tuple[str, Outcome]:
    """One topic, its subscribers spread evenly over the gateway nodes, one publisher on the
    first node: the line's body and its deliveries/s (for the scaling line)."""
    n = plan.fanout_nodes_subscribers
    gateways = cluster.gateways
    topic = "bench/cluster/fanout_nodes"
    subs: list[SubSpec] = []
    for i in range(n):
        g = gateways[i % len(gateways)]
        subs.append((g.port, f"bench-fanout-nodes-sub-{i}", topic, 0, g.name))
    pubs: list[PubSpec] = [(gateways[0].port, "bench-fanout-nodes-pub", topic, 0)]
    # Unpaced, bounded as bench_mqtt's fan-out: the publisher stays at most 20,000 deliveries
    # ahead of the subscribers, so the rate is what the cluster sustains, not a growing backlog
    # (and a QoS 0 subscriber stays far from mqtt_max_queued_messages, past which it drops).
    load = Load(qos=qos, topic_filter="", window=100, seconds=plan.fanout_nodes_seconds, drain_s=plan.drain_s,
                handshake_s=plan.handshake_s, ahead=max(1, FANOUT_NODES_AHEAD_DELIVERIES // n), publishers=1,
                subscribers=n, poll_s=FANOUT_NODES_POLL_S)
    o = run_flow(cluster, load, 1, pubs, subs)
    cpu = o.cpu_pct
    # nodes_cpu_pct: the gateway nodes only here (the store node has its own figure)
    tail_text = (f"p50_ms={o.p50_ms:.2f} p99_ms={o.p99_ms:.2f} gen_cpu_pct={cpu['gen']:.0f} "
                 f"nodes_cpu_pct={cpu['gateways']:.0f} store_cpu_pct={cpu['store']:.0f} "
                 f"other_cpu_pct={cpu['other']:.0f} drain={o.drain}")
    per_delivery = (f"node_cpu_us_per_delivery={o.us_per_delivery['gateways']:.2f} "
                    f"gen_cpu_us_per_delivery={o.us_per_delivery['gen']:.2f}")
    return f"deliveries_per_s={o.rate:.0f} {counts(o)} {per_delivery} {tail_text}", o


def scaling_line(qos: int, one: Outcome, four: Outcome) -> str:
    """4 nodes / 1 node, and what the cores allow: were a delivery on 4 nodes to cost the gateway
    nodes what it costs one node (no cluster overhead at all), the CPU the 4-node case left to
    them and to the load generator (cores - store node - rest of the machine) would still buy
    at most ``bound`` x the 1-node rate; the generator's share is what 1 node got for free."""
    c1 = one.us_per_delivery["gateways"]
    c4 = four.us_per_delivery["gateways"]
    g4 = four.us_per_delivery["gen"]
    usable = (os.cpu_count() or 1) * 100 - four.cpu_pct["store"] - four.cpu_pct["other"]
    bound = usable * 1e4 / (c1 + g4) / one.rate if one.rate and c1 + g4 else 0.0
    return (f"# fanout_nodes scaling qos={qos}: 4 nodes / 1 node = {four.rate / one.rate:.2f} "
            f"(node CPU per delivery {c1:.2f} us on 1 node, {c4:.2f} us on 4; load generator {g4:.2f} us; "
            f"bound of the cores with no cluster overhead: {bound:.2f})")


@dataclass(frozen=True, slots=True)
class Case:
    scenario: str
    nodes: int
    routing: str = "targeted"
    cache: bool = True
    qos: int = 1

    def head(self, plan: Plan) -> str:
        if self.scenario == "spread":
            return f"cluster scenario=spread nodes={self.nodes} routing={self.routing}"
        if self.scenario == "fanout_nodes":
            return (f"cluster scenario=fanout_nodes nodes={self.nodes} qos={self.qos} "
                    f"subscribers={plan.fanout_nodes_subscribers}")
        return f"cluster scenario=fanout subscribers={plan.fanout_subscribers} cache={'on' if self.cache else 'off'}"

    @property
    def label(self) -> str:
        if self.scenario == "spread":
            return f"spread-{self.nodes}-{self.routing}"
        if self.scenario == "fanout_nodes":
            return f"fanout-nodes-{self.nodes}-qos{self.qos}"
        return f"fanout-cache-{'on' if self.cache else 'off'}"


def cases(scenarios: list[str], plan: Plan) -> list[Case]:
    out: list[Case] = []
    if "spread" in scenarios:
        out += [Case("spread", n, routing) for n in plan.nodes for routing in ("targeted", "broadcast")]
    if "fanout" in scenarios:
        out += [Case("fanout", 2, cache=cache) for cache in (True, False)]
    if "fanout_nodes" in scenarios:
        out += [Case("fanout_nodes", n, qos=qos) for qos in plan.fanout_nodes_qos for n in plan.fanout_nodes]
    return out


def run_case(case: Case, plan: Plan, keep_logs: Path | None,
             rates: dict[tuple[int, int], Outcome] | None = None) -> list[str]:
    """One case on a fresh cluster: its line, and a ``#`` line with the first node complaint.
    A fanout_nodes case that ran without errors puts its outcome in ``rates[(qos, nodes)]``."""
    head = case.head(plan)
    suffix = " quick=1" if plan.quick else ""
    cluster: Cluster | None = None
    extra: list[str] = []
    try:
        cluster = start_cluster(case.nodes, case.routing, case.cache)
        outcome: Outcome | None = None
        if case.scenario == "spread":
            body = spread(cluster, plan)
        elif case.scenario == "fanout_nodes":
            body, outcome = fanout_nodes(cluster, plan, case.qos)
        else:
            body = fanout(cluster, plan)
        dead = [f"{n.name}:{n.process.proc.returncode}" for n in cluster.nodes if n.process.proc.poll() is not None]
        if dead:
            body += f' error="node(s) exited during the case: {",".join(dead)}"'
        elif outcome is not None and rates is not None:
            rates[(case.qos, case.nodes)] = outcome
    except Exception as exc:  # noqa: BLE001 - one failed case must not stop the others
        detail = str(exc) if isinstance(exc, ScenarioError) else f"{type(exc).__name__}: {exc}"
        if cluster is not None:
            dead = [f"{n.name} exited with status {n.process.proc.returncode}: {n.process.log_tail()}"
                    for n in cluster.nodes if n.process.proc.poll() is not None]
            detail += "".join(f" ({d})" for d in dead)
        body = f'error="{quote(detail)}"'
    finally:
        if cluster is not None:
            found = complaints(cluster)
            body += f" node_complaints={len(found)}"
            if found:
                kinds = Counter(line.split(" msg=", 1)[-1][:80] for line in found)
                extra = [f"# {case.label}: {quote(found[0])[:400]}",
                         f"# {case.label}: complaint kinds: " + "; ".join(
                             f"{count}x {quote(kind)}" for kind, count in kinds.most_common(4))]
            stop_cluster(cluster, keep_logs, case.label)
    return [f"{head} {body}{suffix}", *extra]


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so that the finally blocks stop every node


def node_counts(text: str, flag: str, minimum: int) -> tuple[int, ...]:
    """``"2,4,8"`` -> (2, 4, 8); a clear exit for anything else."""
    try:
        counts = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        raise SystemExit(f"{flag}: not a list of numbers: {text!r}") from None
    if not counts or min(counts) < minimum:
        raise SystemExit(f"{flag}: {minimum} or more gateway nodes per case")
    return counts


def main() -> None:
    parser = runner.parser(__doc__, quick="N in 2,4, 100 topics, 3 s; 500 fan-out subscribers; "
                                          "fanout_nodes: N in 1,4, 400 subscribers, 5 s")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from " + ",".join(SCENARIOS))
    parser.add_argument("--nodes", help="gateway node counts of the spread scenario, comma-separated "
                                        "(default 2,4,8; --quick: 2,4)")
    parser.add_argument("--fanout-nodes", help="gateway node counts of the fanout_nodes scenario, comma-separated "
                                               "(default 1,2,4; --quick: 1,4)")
    parser.add_argument("--fanout-qos", help="QoS levels of the fanout_nodes scenario, comma-separated (default 0,1)")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR", help="copy every node's console log here")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.nodes:
        plan = replace(plan, nodes=node_counts(args.nodes, "--nodes", 2))
    if args.fanout_nodes:
        plan = replace(plan, fanout_nodes=node_counts(args.fanout_nodes, "--fanout-nodes", 1))
    if args.fanout_qos:
        plan = replace(plan, fanout_nodes_qos=tuple(int(q) for q in parse_list(args.fanout_qos, ("0", "1"), "QoS")))
    scenarios = parse_list(args.scenarios, SCENARIOS, "scenario")
    signal.signal(signal.SIGTERM, _terminated)
    raise_fd_limit()  # the generator's sockets and, inherited, the nodes': 2,000 subscribers on one node
    started = time.perf_counter()
    header = (f"# bench_cluster cores={os.cpu_count()} fd_limit={resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
              + (" quick=1" if plan.quick else ""))
    lines = errors = 0
    rates: dict[tuple[int, int], Outcome] = {}  # fanout_nodes: (qos, nodes) -> its outcome
    with runner.Lines(args.out) as out:
        out.emit(header)
        for case in cases(scenarios, plan):
            for line in run_case(case, plan, args.keep_logs, rates):
                lines += not line.startswith("#")
                errors += ' error="' in line
                out.emit(line)
        for qos in (0, 1):
            if (qos, 1) in rates and (qos, 4) in rates:
                out.emit(scaling_line(qos, rates[(qos, 1)], rates[(qos, 4)]))
    print(f"# {lines} lines ({errors} with errors) in {time.perf_counter() - started:.0f} s "
          f"on {os.cpu_count()} cores", flush=True)


if __name__ == "__main__":
    main()
