"""MQTT benchmark: the same scenarios and load generator against TideMQ, Mosquitto, RabbitMQ's
MQTT plugin and amqtt.

    python -m loadtest.bench_mqtt [--quick] [--brokers tidemq,mosquitto,rabbitmq,amqtt]
                                  [--scenarios fanin,latency,fanout,idle] [--out FILE]

Each scenario gets a fresh broker on a free 127.0.0.1 port (TideMQ with persistence on,
``--flush async``, its default limits, among them ``mqtt_max_queued_messages`` 1,000;
Mosquitto with ``persistence false`` and ``max_queued_messages`` 10,000,000; RabbitMQ 3.10's
MQTT plugin on a private node, its defaults (durable session queues for clean_session=0, none
here); amqtt in its own process), stopped at its end. The load generator runs in separate processes on raw sockets with packets
pre-encoded by ``protocols.mqtt`` (``loadtest.clients.mqtt_load``, on ``loadtest.clients.mqtt_wire``). The scenarios:

- fanin: 8 publishers (topics bench/fanin/N, 2 processes) -> 1 subscriber of bench/fanin/+,
  64-byte payloads, at QoS 0 and 1, for 10 s. At QoS 1 each publisher keeps 1,000 PUBLISHes
  unacknowledged; at QoS 0 it stays at most 1,000 ahead of what the subscriber received.
- latency: 1 publisher -> 1 subscriber at a paced 1,000 messages/s, QoS 1, for 10 s.
- fanout: 1 publisher -> 1,000 subscribers of one topic at QoS 1, up to 2,000 messages in
  15 s, the publisher at most 20,000 deliveries ahead of the subscribers.
- idle: 10,000 connections (CONNECT, CONNACK, keep alive 600) left open; broker RSS growth.

``--quick`` runs 2-3 s each, 100 fan-out subscribers and 1,000 idle connections (its lines
say ``quick=1``). Rates are counted from the first send to the last receive; latencies from
the send time in each payload (CLOCK_MONOTONIC) to the read. One line per scenario:

    mqtt broker=B scenario=fanin qos=Q publishers=8 msgs_per_s=... broker_cpu_us_per_msg=... expected=... received=... lost=... p50_ms=... p99_ms=...
    mqtt broker=B scenario=latency qos=1 rate=1000 ... broker_cpu_us_per_msg=... p50_ms=... p99_ms=...
    mqtt broker=B scenario=fanout qos=1 subscribers=1000 deliveries_per_s=... broker_cpu_us_per_delivery=... expected=... received=...
    mqtt broker=B scenario=idle connections=10000 connect_s=... rss_kib_per_conn=...
    mqtt broker=B scenario=... error="..."          (the broker or the scenario failed; the run goes on)

Every line gives ``gen_cpu_pct`` (all load generator processes), ``broker_cpu_pct`` and
``other_cpu_pct`` (the rest of the machine: other jobs disturb the figures when it is high),
sampled with psutil from the first send to the last receive; 100 is one core.
``broker_cpu_us_per_msg`` is the broker process's CPU (user + system) over that window, widened
to psutil's 0.1 s samples, in microseconds, divided by the distinct messages the subscribers
received in it: for fan-in every message in and out once; in the fan-out it is
``broker_cpu_us_per_delivery``, divided by deliveries (messages x subscribers). ``expected``
counts what the broker took (PUBACKed at QoS 1, written at QoS 0) times the subscribers;
``received`` counts distinct messages (``dup`` the duplicates); ``lost`` is their difference at
QoS 1. ``drain`` says how the subscribers stopped: ``complete`` (all expected arrived),
``idle`` (nothing arrived for 2 s: what is missing was dropped) or ``timeout`` (the drain
timeout, 10 s after the last send, ran out while messages were still arriving: what is
missing had not arrived yet, a broker that acknowledges faster than it delivers).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from loadtest import runner
from loadtest.brokers import (
    MOSQUITTO_QUEUE,
    TIDEMQ_TRACED,
    Broker,
    BrokerUnavailable,
    ScenarioError,
    broker_versions,
    raise_fd_limit,
    start_broker,
)
from loadtest.clients.mqtt_load import (
    Load,
    idle_worker,
    publisher_worker,
    subscriber_worker,
)
from loadtest.harness import (
    SLACK_S,
    CpuSampler,
    Workers,
    deliveries,
    parse_list,
    quote,
    split,
)

ROOT = Path(__file__).resolve().parent.parent
BROKERS = ("tidemq", "mosquitto", "rabbitmq", "amqtt")
SCENARIOS = ("fanin", "latency", "fanout", "idle")
# Per client, so that Mosquitto does not drop QoS 1 on purpose. Everything else is its default
# (max_inflight_messages 20, Nagle on): measured here, that gives twice the QoS 1 fan-in rate
# of max_inflight_messages 1000 with set_tcp_nodelay.
FANIN_WINDOW = 1000  # per publisher: unacknowledged at QoS 1, not yet received at QoS 0
FANOUT_AHEAD_DELIVERIES = 20_000  # fan-out publisher stays this many deliveries ahead of the subscribers
# Fan-out subscribers read every 20 ms: each read of a connection answers with one PUBACK
# segment, so reading 1,000 connections every 1 ms costs the generator more than the broker
# (measured: 31k deliveries/s at 1 ms and 4 processes, 68k at 20 ms and one process a core).
FANOUT_POLL_S = 0.02
FANOUT_PROCS = min(4, max(2, os.cpu_count() or 2))


# -- what to run -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Plan:
    quick: bool
    fanin_publishers: int = 8
    fanin_seconds: float = 10.0
    latency_rate: int = 1000
    latency_seconds: float = 10.0
    fanout_subscribers: int = 1000
    fanout_messages: int = 2000
    fanout_seconds: float = 15.0
    idle_connections: int = 10_000
    idle_timeout_s: float = 60.0
    drain_s: float = 10.0
    handshake_s: float = 30.0


FULL = Plan(quick=False)
QUICK = replace(FULL, quick=True, fanin_seconds=2.0, latency_seconds=2.0, fanout_subscribers=100,
                fanout_messages=1000, fanout_seconds=3.0, idle_connections=1000, idle_timeout_s=10.0,
                drain_s=3.0, handshake_s=10.0)



# -- scenarios -------------------------------------------------------------------------------------
@dataclass(slots=True)
class Outcome:
    rate: float
    expected: int
    received: int
    duplicates: int
    p50_ms: float
    p99_ms: float
    cpu: str  # the CpuSampler.shares of the run
    broker_us: float  # the broker's CPU microseconds per message received (fan-out: per delivery)
    drain: str


def run_flow(broker: Broker, load: Load, publishers: list[tuple[str, str, int]], pub_procs: int,
             subscriber_ids: list[str], sub_procs: int) -> Outcome:
    """Subscribers connect and subscribe, then publishers send; wait for the drain; sum up."""
    sub_groups = split(subscriber_ids, sub_procs)
    w = Workers(len(sub_groups))  # subscribers start first: worker index i counts into DELIVERED + i
    sampler: CpuSampler | None = None
    try:
        for group in sub_groups:
            w.start(subscriber_worker, broker.port, group, load)
        w.collect("subscriber", len(sub_groups), "ready", load.handshake_s + SLACK_S)
        pub_groups = split(publishers, pub_procs)
        for group in pub_groups:
            w.start(publisher_worker, broker.port, group, load)
        w.collect("publisher", len(pub_groups), "ready", load.handshake_s + SLACK_S)
        sampler = CpuSampler([broker.pid, *w.pids])
        sampler.start()
        w.go.set()
        pubs = w.collect("publisher", len(pub_groups), "result", load.seconds + load.drain_s + SLACK_S)
        published = sum(r["acked"] if load.qos else r["sent"] for r in pubs)
        w.publishers_done(published, load.drain_s)
        subs = w.collect("subscriber", len(sub_groups), "result", load.drain_s + SLACK_S)
        sampler.stop()
    finally:
        if sampler is not None:
            sampler.stop()
        w.close()
    d = deliveries(pubs, subs, published)
    return Outcome(
        rate=d.rate,
        expected=published * len(subscriber_ids),
        received=d.received,
        duplicates=d.duplicates,
        p50_ms=d.p50_ms,
        p99_ms=d.p99_ms,
        cpu=sampler.shares(w.pids, broker.pid, d.first_send_ns, d.last_receive_ns),
        broker_us=sampler.us_per_msg([broker.pid], d.first_send_ns, d.last_receive_ns, d.received),
        drain=d.drain,
    )


def counts(o: Outcome, qos: int) -> str:
    text = f"expected={o.expected} received={o.received}"
    if qos:
        text += f" lost={max(0, o.expected - o.received)}"
    return text + f" dup={o.duplicates}"


def tail(o: Outcome) -> str:
    return f"p50_ms={o.p50_ms:.2f} p99_ms={o.p99_ms:.2f} {o.cpu} drain={o.drain}"


def fanin(broker: Broker, plan: Plan, qos: int) -> str:
    n = plan.fanin_publishers
    # QoS 0 has no PUBACK window: its counterpart is a bound on what the subscriber has not
    # received yet, so a broker slower than the publishers is measured at its sustained rate
    # and not on an ever-growing backlog.
    load = Load(qos=qos, topic_filter="bench/fanin/+", window=FANIN_WINDOW, seconds=plan.fanin_seconds,
                drain_s=plan.drain_s, handshake_s=plan.handshake_s, ahead=0 if qos else FANIN_WINDOW,
                publishers=n)
    pubs = [(f"bench-fanin-pub-{i}", f"bench/fanin/{i}", i) for i in range(n)]
    o = run_flow(broker, load, pubs, pub_procs=2, subscriber_ids=["bench-fanin-sub"], sub_procs=1)
    return (f"publishers={n} seconds={plan.fanin_seconds:g} msgs_per_s={o.rate:.0f} "
            f"broker_cpu_us_per_msg={o.broker_us:.2f} {counts(o, qos)} {tail(o)}")


def latency(broker: Broker, plan: Plan) -> str:
    load = Load(qos=1, topic_filter="bench/latency", window=1000, seconds=plan.latency_seconds,
                drain_s=plan.drain_s, handshake_s=plan.handshake_s, rate=plan.latency_rate, poll_s=0.0)
    o = run_flow(broker, load, [("bench-latency-pub", "bench/latency", 0)], pub_procs=1,
                 subscriber_ids=["bench-latency-sub"], sub_procs=1)
    return (f"rate={plan.latency_rate} seconds={plan.latency_seconds:g} msgs_per_s={o.rate:.0f} "
            f"broker_cpu_us_per_msg={o.broker_us:.2f} {counts(o, 1)} {tail(o)}")


def fanout(broker: Broker, plan: Plan) -> str:
    n = plan.fanout_subscribers
    load = Load(qos=1, topic_filter="bench/fanout", window=100, seconds=plan.fanout_seconds,
                drain_s=plan.drain_s, handshake_s=plan.handshake_s, max_messages=plan.fanout_messages,
                ahead=max(1, FANOUT_AHEAD_DELIVERIES // n), subscribers=n, poll_s=FANOUT_POLL_S)
    o = run_flow(broker, load, [("bench-fanout-pub", "bench/fanout", 0)], pub_procs=1,
                 subscriber_ids=[f"bench-fanout-sub-{i}" for i in range(n)], sub_procs=FANOUT_PROCS)
    return (f"subscribers={n} messages={o.expected // n} deliveries_per_s={o.rate:.0f} "
            f"broker_cpu_us_per_delivery={o.broker_us:.2f} {counts(o, 1)} {tail(o)}")


def idle(broker: Broker, plan: Plan) -> str:
    n = plan.idle_connections
    groups = split([f"bench-idle-{i}" for i in range(n)], 2)
    w = Workers()
    sampler: CpuSampler | None = None
    broker_proc = psutil.Process(broker.pid)
    try:
        for group in groups:
            w.start(idle_worker, broker.port, group, plan.idle_timeout_s)
        w.collect("idle", len(groups), "ready", SLACK_S)
        rss_before = broker_proc.memory_info().rss
        sampler = CpuSampler([broker.pid, *w.pids])
        sampler.start()
        w.go.set()
        results = w.collect("idle", len(groups), "result", plan.idle_timeout_s + SLACK_S)
        sampler.stop()
        time.sleep(1.0)  # let the broker settle what it allocates after CONNACK
        rss_after = broker_proc.memory_info().rss
    finally:
        if sampler is not None:
            sampler.stop()
        w.close()
    opened = sum(r["opened"] for r in results)
    start = min(r["start_ns"] for r in results)
    end = max(r["end_ns"] for r in results)
    errors = [r["error"] for r in results if r["error"]]
    if not opened:
        raise BrokerUnavailable(errors[0] if errors else "no connection opened")
    line = (f"connections={n} connected={opened} connect_s={(end - start) / 1e9:.2f} "
            f"rss_kib_per_conn={(rss_after - rss_before) / 1024 / opened:.1f} "
            f"broker_rss_mib={rss_after >> 20} {sampler.shares(w.pids, broker.pid, start, end)}")
    if errors:
        line += f' error="{quote(errors[0])}"'
    return line


def cases(scenarios: list[str]) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for name in scenarios:
        if name == "fanin":
            out += [("fanin", 0), ("fanin", 1)]
        elif name in ("latency", "fanout"):
            out.append((name, 1))
        else:
            out.append((name, None))
    return out


def run_case(broker_name: str, scenario: str, qos: int | None, plan: Plan,
             unavailable: dict[str, str]) -> str:
    """One scenario on a fresh broker, as its printed line; notes a broker that serves no MQTT
    in ``unavailable`` so that its next scenarios are skipped, not waited for."""
    head = f"mqtt broker={broker_name} scenario={scenario}" + (f" qos={qos}" if qos is not None else "")
    suffix = " quick=1" if plan.quick else ""
    if broker_name in unavailable:
        return f'{head} error="skipped: {unavailable[broker_name]}"{suffix}'
    broker: Broker | None = None
    try:
        broker = start_broker(broker_name)
        if scenario == "fanin":
            body = fanin(broker, plan, qos or 0)
        elif scenario == "latency":
            body = latency(broker, plan)
        elif scenario == "fanout":
            body = fanout(broker, plan)
        else:
            body = idle(broker, plan)
        if broker.proc.poll() is not None:
            body += f' error="broker exited with status {broker.proc.returncode} during the scenario"'
    except Exception as exc:  # noqa: BLE001 - one failed case must not stop the others
        detail = str(exc) if isinstance(exc, ScenarioError) else f"{type(exc).__name__}: {exc}"
        if broker is not None and broker.proc.poll() is not None:
            detail += f" (broker exited with status {broker.proc.returncode}: {broker.log_tail()})"
        elif broker is not None and (complaints := broker.log_tail(2, complaints_only=True)):
            detail += f" (broker log: {complaints})"
        body = f'error="{quote(detail)}"'
        if isinstance(exc, BrokerUnavailable):
            unavailable[broker_name] = quote(detail)
    finally:
        if broker is not None:
            broker.stop()
    return f"{head} {body}{suffix}"


def main() -> None:
    parser = runner.parser(__doc__, quick="short runs, 100 fan-out subscribers, 1,000 idle connections: "
                                          "under 90 s for all brokers")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated, from " + ",".join(BROKERS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from " + ",".join(SCENARIOS))
    parser.add_argument("--trace", choices=("off", "on", "both"), default="off",
                        help="message trace on TideMQ's MQTT listener; both: TideMQ without and with it, "
                             f"side by side (broker {TIDEMQ_TRACED})")
    parser.add_argument("--soak-minutes", type=float, metavar="N",
                        help="instead: a soak of N minutes against TideMQ (see loadtest/scenarios/soak_mqtt.py)")
    parser.add_argument("--soak-rate", type=float, default=2000.0, help="QoS 1 publishes per second in the soak")
    args = parser.parse_args()
    if args.soak_minutes:
        from loadtest.scenarios import soak_mqtt

        raise SystemExit(soak_mqtt.main(["--minutes", str(args.soak_minutes), "--rate", str(args.soak_rate)]))
    brokers = parse_list(args.brokers, BROKERS, "broker")
    if args.trace != "off" and "tidemq" in brokers:
        at = brokers.index("tidemq")
        brokers[at:at + 1] = [TIDEMQ_TRACED] if args.trace == "on" else ["tidemq", TIDEMQ_TRACED]
    scenarios = parse_list(args.scenarios, SCENARIOS, "scenario")
    plan = QUICK if args.quick else FULL
    raise_fd_limit()
    started = time.perf_counter()
    header = (f"# bench_mqtt {broker_versions()} cores={os.cpu_count()} "
              f"fd_limit={resource.getrlimit(resource.RLIMIT_NOFILE)[0]} "
              f"mosquitto_max_queued_messages={MOSQUITTO_QUEUE}" + (" quick=1" if plan.quick else ""))
    lines = errors = 0
    unavailable: dict[str, str] = {}
    with runner.Lines(args.out) as out:
        out.emit(header)
        for broker_name in brokers:
            for scenario, qos in cases(scenarios):
                line = run_case(broker_name, scenario, qos, plan, unavailable)
                lines += 1
                errors += ' error="' in line
                out.emit(line)
    print(f"# {lines} lines ({errors} with errors) for {','.join(brokers)} in "
          f"{time.perf_counter() - started:.0f} s on {os.cpu_count()} cores", flush=True)


if __name__ == "__main__":
    main()
