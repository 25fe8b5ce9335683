"""The scenarios of ``bench_amqp`` as the coordinator runs them: what to run (``Plan``), queue
set-up and clean-up on its own AMQP connection, the queue-count polls, and one function per
scenario that starts the load generator processes (``loadtest.clients.amqp_load``), samples the CPU
and returns the scenario's line. ``RUNNERS`` maps scenario names to them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from collections.abc import Callable
from typing import Any

from pamqp import commands

from loadtest.brokers import Broker, ScenarioError
from loadtest.clients.amqp_load import (
    BODY,
    CHANNELS_PER_CONN,
    IDLE_FOR_S,
    PubLoad,
    SubLoad,
    consumer_worker,
    publisher_worker,
)
from loadtest.clients.amqp_wire import Conn, publish_frames
from loadtest.harness import (
    DELIVERED,
    SLACK_S,
    CpuSampler,
    Workers,
    deliveries,
    drain_outcome,
    quote,
    split,
)

COUNT_POLL_S = 0.01  # the coordinator's queue.declare passive polls
FANOUT_KEY = "bench.fanout.msg"
FANOUT_PATTERN = "bench.fanout.#"
FANOUT_PROCS = 2
# Fan-out consumers read every 5 ms: 100 channels share the deliveries, so a channel gets a few
# per read and prefetch 100 never binds, while each read of a connection costs a recv and an
# ack write; reading every 1 ms cost the generator ~9 us per delivery (RabbitMQ, 25k/s).
FANOUT_POLL_S = 0.005
FANOUT_FEW_CONNS = 50  # channels (queues) a consumer connection in the "few connections" patterns: 2 in all


# -- what to run -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Plan:
    quick: bool
    seconds: float = 15.0  # publish_confirm, publish, fanout_topic: how long the publishers send
    publishers: int = 4  # connections, publish_confirm and publish
    publisher_procs: int = 1
    window: int = 1000  # unconfirmed publishes per publisher (publish_confirm)
    write_batch: int = 1000  # publishes per write (publish)
    # publish: sent at most this many ahead of the queue's count (else socket buffers, up to
    # tens of MB on loopback, hold seconds of backlog and "sent" says nothing of the broker)
    publish_ahead: int = 20_000
    consume_messages: int = 300_000
    consume_timeout_s: float = 60.0
    prefetch: int = 100
    fanout_queues: int = 100
    fanout_window: int = 100
    fanout_ahead: int = 300  # messages ahead of the average queue's consumer at most
    latency_rate: float = 1000.0  # messages/s, paced
    latency_seconds: float = 10.0
    # unconfirmed publishes at most: a second's worth at the pace, so that confirms never
    # hold the pace back (a sync flush confirms within milliseconds)
    latency_window: int = 1000
    drain_s: float = 15.0
    handshake_s: float = 30.0


FULL = Plan(quick=False)
QUICK = replace(FULL, quick=True, seconds=3.0, consume_messages=30_000, consume_timeout_s=15.0, drain_s=5.0,
                handshake_s=10.0, latency_seconds=3.0)


@dataclass(frozen=True, slots=True)
class Acks:
    """How consumers acknowledge, as real clients do (``SubLoad.ack_every`` / ``no_ack``): ``read``
    one ``multiple`` ack per channel for what a read brought, ``each`` an ack per delivery (what
    pika, aio-pika and kombu do by default), ``multipleN`` a ``multiple`` ack every N deliveries,
    ``none`` no-ack consumers."""

    name: str
    every: int = 0
    no_ack: bool = False


ACK_READ, ACK_EACH, ACK_25, NO_ACK = Acks("read"), Acks("each", 1), Acks("multiple25", 25), Acks("none", no_ack=True)


@dataclass(frozen=True, slots=True)
class Fanout:
    """A fan-out's client pattern: how its consumers acknowledge and how many channels (queues)
    share a consumer connection; and its publisher's confirm window and how far it may run
    ahead of the average queue's consumer (0: no bound)."""

    acks: Acks
    channels_per_conn: int
    window: int
    ahead: int


# -- the coordinator's side ------------------------------------------------------------------------
def cpu_fields(sampler: CpuSampler, gen: list[int], broker: int, start_ns: int, end_ns: int) -> str:
    gen_pct, own, other = sampler.split(gen, broker, start_ns, end_ns)
    return f"gen_cpu={gen_pct:.0f}% broker_cpu={own:.0f}% other_cpu={other:.0f}%"


def broker_us(sampler: CpuSampler, broker: int, start_ns: int, end_ns: int, messages: int,
              unit: str = "msg") -> str:
    """The broker's CPU microseconds per message (``unit`` "delivery": per delivery), for beside the rate."""
    return f"broker_cpu_us_per_{unit}={sampler.us_per_msg([broker], start_ns, end_ns, messages):.2f}"


def setup_conn(broker: Broker, plan: Plan) -> Conn:
    conn = Conn(broker.port, plan.handshake_s)
    conn.open_channel(1)
    return conn


def declare_queue(conn: Conn, name: str) -> None:
    conn.rpc(1, commands.Queue.Declare(queue=name, durable=True), commands.Queue.DeclareOk)


def delete_queues(broker: Broker, plan: Plan, names: list[str], exchange: str = "") -> None:
    """Clean up after a scenario on a fresh connection (a failed scenario may have closed the other)."""
    conn = setup_conn(broker, plan)
    try:
        for name in names:
            conn.rpc(1, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)
        if exchange:
            conn.rpc(1, commands.Exchange.Delete(exchange=exchange), commands.Exchange.DeleteOk)
    finally:
        conn.close()


def wait_count(conn: Conn, queue: str, target: int, timeout_s: float,
               settle_s: float = IDLE_FOR_S) -> tuple[int, int, str]:
    """Poll the queue's message_count until it reaches ``target`` ("complete"), stops changing
    for ``settle_s`` ("idle") or ``timeout_s`` runs out ("timeout"); returns it, when it last
    changed (monotonic ns) and which."""
    deadline = time.monotonic_ns() + int(timeout_s * 1e9)
    count = conn.message_count(1, queue)
    changed = time.monotonic_ns()
    while count < target:
        now = time.monotonic_ns()
        if now > deadline:
            return count, changed, "timeout"
        if now - changed > settle_s * 1e9:
            return count, changed, "idle"
        time.sleep(COUNT_POLL_S)
        latest = conn.message_count(1, queue)
        if latest != count:
            count, changed = latest, time.monotonic_ns()
    return count, changed, "complete"


class CountPoller:
    """Polls a queue's message_count (queue.declare passive on the coordinator's connection)
    into the DELIVERED slot while the publishers run: their ``ahead`` bound."""

    def __init__(self, conn: Conn, queue: str, shared: Any) -> None:
        self.conn, self.queue, self.shared = conn, queue, shared
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(COUNT_POLL_S):
                self.shared[DELIVERED] = self.conn.message_count(1, self.queue)
        except Exception as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.conn.timeout_s + 5)
        if self._thread.is_alive():
            raise ScenarioError("queue.declare passive got no answer")
        if self.error is not None:
            raise self.error


def run_publishers(broker: Broker, plan: Plan, load: PubLoad, poll: tuple[Conn, str] | None = None,
                   after: Any = None) -> tuple[list[dict[str, Any]], Any, CpuSampler, list[int]]:
    """Publisher processes against an existing queue (whose count ``poll`` feeds their
    ``ahead`` bound); ``after(pubs)`` runs while the CPU sampler and the publishers'
    connections are still up."""
    groups = split(list(range(plan.publishers)), plan.publisher_procs)
    w = Workers()
    sampler: CpuSampler | None = None
    poller: CountPoller | None = None
    try:
        for group in groups:
            w.start(publisher_worker, broker.port, len(group), load)
        w.collect("publisher", len(groups), "ready", load.handshake_s + SLACK_S)
        sampler = CpuSampler([broker.pid, *w.pids])
        sampler.start()
        if poll is not None:
            poller = CountPoller(*poll, w.shared)
        w.go.set()
        pubs = w.collect("publisher", len(groups), "result", load.seconds + load.drain_s + SLACK_S)
        if poller is not None:
            poller.stop()
            poller = None
        extra = after(pubs) if after is not None else None
        sampler.stop()
    finally:
        if poller is not None:
            poller.stop()
        if sampler is not None:
            sampler.stop()
        w.close()
    return pubs, extra, sampler, w.pids


def publish_confirm(broker: Broker, plan: Plan) -> str:
    queue = "bench.publish_confirm"
    conn = setup_conn(broker, plan)
    try:
        declare_queue(conn, queue)
        load = PubLoad("", queue, confirm=True, window=plan.window, seconds=plan.seconds, drain_s=plan.drain_s,
                       handshake_s=plan.handshake_s)
        pubs, _, sampler, pids = run_publishers(broker, plan, load)
        queued = conn.message_count(1, queue)
    finally:
        conn.close()
    delete_queues(broker, plan, [queue])
    sent, confirmed, nacked = (sum(r[k] for r in pubs) for k in ("sent", "confirmed", "nacked"))
    first = min((r["first_send_ns"] for r in pubs if r["first_send_ns"]), default=0)
    last = max(r["last_confirm_ns"] for r in pubs)
    if not first or not confirmed:
        raise ScenarioError(f"nothing confirmed: sent={sent} nacked={nacked}")
    line = (f"publishers={plan.publishers} window={plan.window} seconds={plan.seconds:g} "
            f"msgs_per_s={confirmed / max(1, last - first) * 1e9:.0f} "
            f"{broker_us(sampler, broker.pid, first, last, confirmed)} sent={sent} confirmed={confirmed} "
            f"nacked={nacked} unconfirmed={sent - confirmed - nacked} queued={queued} "
            f"lost={max(0, confirmed - queued)} {cpu_fields(sampler, pids, broker.pid, first, last)}")
    return line + blocked_note(pubs)


def blocked_note(pubs: list[dict[str, Any]]) -> str:
    blocked = next((r["blocked"] for r in pubs if r.get("blocked")), "")
    return f' blocked="{quote(blocked)}"' if blocked else ""


def publish(broker: Broker, plan: Plan) -> str:
    queue = "bench.publish"
    conn = setup_conn(broker, plan)
    try:
        declare_queue(conn, queue)
        load = PubLoad("", queue, confirm=False, window=plan.write_batch, seconds=plan.seconds,
                       drain_s=plan.drain_s, handshake_s=plan.handshake_s, ahead=plan.publish_ahead)
        pubs, (queued, last, drain), sampler, pids = run_publishers(
            broker, plan, load, poll=(conn, queue),
            after=lambda pubs: wait_count(conn, queue, sum(r["sent"] for r in pubs), plan.drain_s))
    finally:
        conn.close()
    delete_queues(broker, plan, [queue])
    sent = sum(r["sent"] for r in pubs)
    first = min((r["first_send_ns"] for r in pubs if r["first_send_ns"]), default=0)
    if not first or not queued:
        raise ScenarioError(f"nothing queued: sent={sent} queued={queued}")
    drain_s = (last - max(r["last_send_ns"] for r in pubs)) / 1e9
    return (f"publishers={plan.publishers} seconds={plan.seconds:g} "
            f"msgs_per_s={queued / max(1, last - first) * 1e9:.0f} "
            f"{broker_us(sampler, broker.pid, first, last, queued)} sent={sent} queued={queued} "
            f"lost={max(0, sent - queued)} drain_s={max(0.0, drain_s):.2f} "
            f"{cpu_fields(sampler, pids, broker.pid, first, last)} drain={drain}" + blocked_note(pubs))


def prefill(conn: Conn, queue: str, count: int, timeout_s: float) -> int:
    """``count`` persistent publishes without confirms, then wait until the queue counts them."""
    frame = publish_frames(1, "", queue, BODY)
    batch = 1000
    chunk = frame * batch
    for _ in range(count // batch):
        conn.sock.sendall(chunk)
    if count % batch:
        conn.sock.sendall(frame * (count % batch))
    queued, _, _ = wait_count(conn, queue, count, timeout_s, settle_s=10.0)
    if queued < count:
        raise ScenarioError(f"prefill: the queue counts {queued} of {count} messages after {timeout_s:g} s")
    return queued


def consume(broker: Broker, plan: Plan, on_filled: Callable[[], None] | None = None, acks: Acks = ACK_READ) -> str:
    """``on_filled()``, if given, is called once the queue is filled (a profiler attaches there)."""
    queue = "bench.consume"
    conn = setup_conn(broker, plan)
    w = Workers(1)
    sampler: CpuSampler | None = None
    try:
        declare_queue(conn, queue)
        t0 = time.monotonic()
        filled = prefill(conn, queue, plan.consume_messages, plan.consume_timeout_s)
        fill_s = time.monotonic() - t0
        if on_filled is not None:
            on_filled()
        load = SubLoad(plan.prefetch, consume_on_go=True, timeout_s=plan.consume_timeout_s,
                       handshake_s=plan.handshake_s, ack_every=acks.every, no_ack=acks.no_ack)
        w.start(consumer_worker, broker.port, [queue], load)
        w.collect("consumer", 1, "ready", plan.handshake_s + SLACK_S)
        sampler = CpuSampler([broker.pid, *w.pids])
        sampler.start()
        w.publishers_done(filled, plan.consume_timeout_s)  # the queue was filled before
        w.go.set()
        (sub,) = w.collect("consumer", 1, "result", plan.consume_timeout_s + SLACK_S)
        sampler.stop()
        pids = w.pids
        w.close()  # the consumer's connection closes: what it did not ack goes back to the queue
        remaining, _, _ = wait_count(conn, queue, filled - sub["delivered"], 5.0, settle_s=0.5)
    finally:
        if sampler is not None:
            sampler.stop()
        w.close()
        conn.close()
    delete_queues(broker, plan, [queue])
    consumed = sub["delivered"]
    if not consumed:
        raise ScenarioError(f"nothing consumed of {filled} ({sub['outcome']})")
    start, last = sub["start_ns"], sub["last_delivery_ns"]
    return (f"prefetch={plan.prefetch} acks={acks.name} messages={filled} msgs_per_s={consumed / max(1, last - start) * 1e9:.0f} "
            f"{broker_us(sampler, broker.pid, start, last, consumed)} consumed={consumed} remaining={remaining} "
            f"lost={max(0, filled - consumed - remaining)} "
            f"prefill_s={fill_s:.1f} {cpu_fields(sampler, pids, broker.pid, start, last)} drain={sub['outcome']}")


def fanout_topic(broker: Broker, plan: Plan, pattern: Fanout | None = None) -> str:
    exchange = "bench.fanout"
    queues = [f"bench.fanout.q{i:03d}" for i in range(plan.fanout_queues)]
    conn = setup_conn(broker, plan)
    try:
        conn.rpc(1, commands.Exchange.Declare(exchange=exchange, exchange_type="topic", durable=True),
                 commands.Exchange.DeclareOk)
        for queue in queues:
            declare_queue(conn, queue)
            conn.rpc(1, commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=FANOUT_PATTERN),
                     commands.Queue.BindOk)
    finally:
        conn.close()
    pattern = pattern or Fanout(ACK_READ, CHANNELS_PER_CONN, plan.fanout_window, plan.fanout_ahead)
    groups = split(queues, FANOUT_PROCS)
    w = Workers(len(groups))  # consumers first: worker i counts into DELIVERED + i
    sampler: CpuSampler | None = None
    try:
        sub_load = SubLoad(plan.prefetch, consume_on_go=False, timeout_s=plan.seconds + 2 * plan.drain_s,
                           handshake_s=plan.handshake_s, poll_s=FANOUT_POLL_S, ack_every=pattern.acks.every,
                           no_ack=pattern.acks.no_ack, channels_per_conn=pattern.channels_per_conn)
        for group in groups:
            w.start(consumer_worker, broker.port, group, sub_load)
        w.collect("consumer", len(groups), "ready", plan.handshake_s + SLACK_S)
        pub_load = PubLoad(exchange, FANOUT_KEY, confirm=True, window=pattern.window, seconds=plan.seconds,
                           drain_s=plan.drain_s, handshake_s=plan.handshake_s, ahead=pattern.ahead,
                           consumer_channels=len(queues))
        w.start(publisher_worker, broker.port, 1, pub_load)
        w.collect("publisher", 1, "ready", plan.handshake_s + SLACK_S)
        sampler = CpuSampler([broker.pid, *w.pids])
        sampler.start()
        w.go.set()
        (pub,) = w.collect("publisher", 1, "result", plan.seconds + plan.drain_s + SLACK_S)
        w.publishers_done(pub["confirmed"], plan.drain_s)
        subs = w.collect("consumer", len(groups), "result", plan.drain_s + SLACK_S)
        sampler.stop()
    finally:
        if sampler is not None:
            sampler.stop()
        pids = w.pids
        w.close()
    delete_queues(broker, plan, queues, exchange)
    deliveries = sum(r["delivered"] for r in subs)
    first = pub["first_send_ns"]
    last = max(r["last_delivery_ns"] for r in subs)
    if not first or not deliveries:
        raise ScenarioError(f"nothing delivered: sent={pub['sent']} confirmed={pub['confirmed']}")
    expected = pub["confirmed"] * len(queues)
    drain = drain_outcome({r["outcome"] for r in subs})
    elapsed = max(1, last - first) / 1e9
    conns = sum(-(-len(g) // pattern.channels_per_conn) for g in groups)
    return (f"queues={len(queues)} acks={pattern.acks.name} consumer_conns={conns} window={pattern.window} "
            f"ahead={pattern.ahead} seconds={plan.seconds:g} deliveries_per_s={deliveries / elapsed:.0f} "
            f"{broker_us(sampler, broker.pid, first, last, deliveries, 'delivery')} "
            f"published_per_s={pub['confirmed'] / elapsed:.0f} sent={pub['sent']} confirmed={pub['confirmed']} "
            f"expected={expected} delivered={deliveries} lost={max(0, expected - deliveries)} "
            f"{cpu_fields(sampler, pids, broker.pid, first, last)} drain={drain}" + blocked_note([pub]))


def latency(broker: Broker, plan: Plan) -> str:
    queue = "bench.latency"
    conn = setup_conn(broker, plan)
    try:
        declare_queue(conn, queue)
    finally:
        conn.close()
    w = Workers(1)  # the consumer first: it counts into DELIVERED
    sampler: CpuSampler | None = None
    try:
        # both read on readiness (poll_s 0): a read every millisecond would add up to 1 ms
        sub_load = SubLoad(plan.prefetch, consume_on_go=False, timeout_s=plan.latency_seconds + 2 * plan.drain_s,
                           handshake_s=plan.handshake_s, poll_s=0.0, stamps=True)
        w.start(consumer_worker, broker.port, [queue], sub_load)
        w.collect("consumer", 1, "ready", plan.handshake_s + SLACK_S)
        pub_load = PubLoad("", queue, confirm=True, window=plan.latency_window, seconds=plan.latency_seconds,
                           drain_s=plan.drain_s, handshake_s=plan.handshake_s, poll_s=0.0,
                           rate=plan.latency_rate, stamp=True)
        w.start(publisher_worker, broker.port, 1, pub_load)
        w.collect("publisher", 1, "ready", plan.handshake_s + SLACK_S)
        sampler = CpuSampler([broker.pid, *w.pids])
        sampler.start()
        w.go.set()
        (pub,) = w.collect("publisher", 1, "result", plan.latency_seconds + plan.drain_s + SLACK_S)
        w.publishers_done(pub["confirmed"], plan.drain_s)
        (sub,) = w.collect("consumer", 1, "result", plan.drain_s + SLACK_S)
        sampler.stop()
    finally:
        if sampler is not None:
            sampler.stop()
        pids = w.pids
        w.close()
    delete_queues(broker, plan, [queue])
    d = deliveries([pub], [sub], pub["confirmed"])
    return (f"rate={plan.latency_rate:g} seconds={plan.latency_seconds:g} window={plan.latency_window} "
            f"prefetch={plan.prefetch} msgs_per_s={d.rate:.0f} "
            f"{broker_us(sampler, broker.pid, d.first_send_ns, d.last_receive_ns, d.received)} "
            f"sent={pub['sent']} confirmed={pub['confirmed']} received={d.received} "
            f"lost={max(0, pub['confirmed'] - d.received)} dup={d.duplicates} "
            f"p50_ms={d.p50_ms:.2f} p99_ms={d.p99_ms:.2f} "
            f"{cpu_fields(sampler, pids, broker.pid, d.first_send_ns, d.last_receive_ns)} drain={d.drain}"
            + blocked_note([pub]))


# Each consume and fan-out scenario is one client pattern (``Acks``, ``Fanout``): its line says which.
# fanout_topic's manual acks are what makes RabbitMQ's deliveries dear (persistent messages it
# must settle in its queue index): a real pattern, kept; fanout_topic_no_ack is the independent
# generator's (no-ack consumers, 50 queues a connection, 2,000 unconfirmed publishes).
RUNNERS: dict[str, Callable[[Broker, Plan], str]] = {
    "publish_confirm": publish_confirm,
    "publish": publish,
    "consume": consume,
    "consume_ack_each": lambda broker, plan: consume(broker, plan, acks=ACK_EACH),
    "consume_multiple25": lambda broker, plan: consume(broker, plan, acks=ACK_25),
    "consume_no_ack": lambda broker, plan: consume(broker, plan, acks=NO_ACK),
    "fanout_topic": fanout_topic,
    "fanout_topic_ack_each": lambda broker, plan: fanout_topic(
        broker, plan, Fanout(ACK_EACH, FANOUT_FEW_CONNS, plan.fanout_window, plan.fanout_ahead)),
    "fanout_topic_no_ack": lambda broker, plan: fanout_topic(
        broker, plan, Fanout(NO_ACK, FANOUT_FEW_CONNS, 2000, 0)),
    "latency": latency,
}
