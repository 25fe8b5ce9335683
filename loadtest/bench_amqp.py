"""AMQP 0-9-1 benchmark: the same workload against TideMQ and RabbitMQ in one run.

    bash scripts/bench-setup.sh && .venv/bin/python -m loadtest.bench_amqp --quick
    python -m loadtest.bench_amqp [--quick] [--brokers tidemq,rabbitmq]
                                  [--scenarios publish_confirm,publish,consume,fanout_topic] [--out FILE]

Brokers (``loadtest.brokers.start_amqp_broker``), one per broker for all its scenarios, each on a
free 127.0.0.1 port and stopped by PID at the end: TideMQ (``python -m gateway serve`` with only
the AMQP listener, ``--flush sync``: a publish is confirmed after fdatasync) and a private
RabbitMQ node from Debian's ``rabbitmq-server`` package (its own epmd, config, data and logs in
a temp dir, no plugins; it fsyncs before confirming persistent messages too). Both get durable
queues and persistent messages (delivery_mode 2); every scenario declares its own queues and
deletes them at its end; a broker that died is started again for the next scenario. A broker
that is not installed or does not start gets ``skipped reason=...`` lines; the other goes on.

Load generator: forked processes on raw sockets (``loadtest.amqp_wire``). pamqp encodes the
handshake and one publish (method, content header and 64-byte body frames) once; a publisher
writes that publish N times from one pre-built buffer, and incoming frames are walked on their
boundaries, reading only basic.ack/nack (confirms, multiple flag) and basic.deliver + header +
body in place. Sockets are read every millisecond rather than on each readiness (as in
bench_mqtt), so one read takes many frames and a consumer's basic.ack (multiple, per channel
and read) covers many deliveries. The scenarios:

- publish_confirm: 4 publisher connections (one process), confirm mode, each keeping up to
  1,000 publishes unconfirmed, into one durable queue for ``seconds``; then they wait for the
  last confirms. ``msgs_per_s`` = confirmed / (first send .. last confirm). Afterwards
  queue.declare passive must count every confirmed message: ``lost`` = confirmed - queued.
- publish: the same without confirms, writing as fast as the broker reads. The coordinator
  polls the queue's message_count (queue.declare passive) every 10 ms and the publishers stay
  at most 20,000 messages ahead of it (else loopback socket buffers, tens of MB, would hold
  seconds of backlog); after ``seconds`` it polls until the queue holds everything sent or
  stops growing: ``msgs_per_s`` = queued / (first send .. the poll that saw the last message),
  ``lost`` = sent - queued.
- consume: a durable queue pre-filled (not timed) with ``messages`` persistent messages; one
  consumer connection, basic.qos prefetch 100, manual acks; ``msgs_per_s`` = consumed /
  (basic.consume .. last delivery). ``lost`` = pre-filled - consumed - what the queue still
  counts after the consumer closed.
- fanout_topic: a durable topic exchange, 100 durable queues bound with the same pattern
  (``bench.fanout.#``), one consumer channel each (prefetch 100, manual acks; 10 channels a
  connection, 2 processes); one confirming publisher (window 100) sends persistent messages
  with routing key ``bench.fanout.msg`` for ``seconds``, staying at most 300 messages ahead of
  the average queue's consumer. ``deliveries_per_s`` = deliveries counted across the 100 queues /
  (first send .. last delivery); ``lost`` = confirmed x 100 - deliveries. Consumers read every
  5 ms here (100 channels share the deliveries: prefetch never binds).

``drain`` says how the counting ended: ``complete`` (all expected counted), ``idle`` (nothing
more came for 2 s: what is missing was dropped) or ``timeout`` (still arriving when the drain
bound, 15 s, 5 s with --quick, ran out: what is missing had not arrived yet).

``--quick`` sends for 3 s (consume: 30,000 messages) instead of 15 s (300,000), for both brokers
and all scenarios in well under 90 s (35 s here); its lines say ``quick=1``. One line per (broker, scenario):

    amqp broker=B scenario=publish_confirm ... msgs_per_s=... broker_cpu_us_per_msg=... confirmed=... queued=... lost=0
         gen_cpu=..% broker_cpu=..% other_cpu=..%              (one line)
    amqp broker=B scenario=... error="..."             (the scenario failed; the run goes on)
    amqp broker=B scenario=... skipped reason="..."    (the broker is missing or did not start)

``gen_cpu`` is all load generator processes, ``broker_cpu`` the broker (TideMQ's Python process,
RabbitMQ's beam.smp), ``other_cpu`` the rest of the machine (other jobs; high values disturb the
figures; the coordinator's psutil sampling and count polls land there too), sampled with psutil
every 0.1 s over the interval the rate is computed on; 100% is one core.
``broker_cpu_us_per_msg``, beside each rate, is the broker process's CPU seconds (user + system)
over that interval, widened to the 0.1 s samples, in microseconds, divided by the messages
counted in it (confirmed, queued or consumed); fanout_topic's ``broker_cpu_us_per_delivery``
divides by the deliveries across its 100 queues.
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from pamqp import commands

from loadtest.amqp_load import (
    BODY,
    IDLE_FOR_S,
    PubLoad,
    SubLoad,
    consumer_worker,
    publisher_worker,
)
from loadtest.amqp_wire import AMQPClientError, Conn, publish_frames
from loadtest.brokers import (
    Broker,
    BrokerUnavailable,
    ScenarioError,
    rabbitmq_version,
    raise_fd_limit,
    start_amqp_broker,
)
from loadtest.harness import (
    DELIVERED,
    SLACK_S,
    CpuSampler,
    Workers,
    drain_outcome,
    parse_list,
    quote,
    split,
)

BROKERS = ("tidemq", "rabbitmq")
SCENARIOS = ("publish_confirm", "publish", "consume", "fanout_topic")
COUNT_POLL_S = 0.01  # the coordinator's queue.declare passive polls
FANOUT_KEY = "bench.fanout.msg"
FANOUT_PATTERN = "bench.fanout.#"
FANOUT_PROCS = 2
# Fan-out consumers read every 5 ms: 100 channels share the deliveries, so a channel gets a few
# per read and prefetch 100 never binds, while each read of a connection costs a recv and an
# ack write; reading every 1 ms cost the generator ~9 us per delivery (RabbitMQ, 25k/s).
FANOUT_POLL_S = 0.005
# What a fresh broker always logs as a warning: not worth a log_complaints line.
BENIGN_LOG_LINES = ("rebuilding indices from scratch",)  # RabbitMQ's first boot of a message store


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
    drain_s: float = 15.0
    handshake_s: float = 30.0


FULL = Plan(quick=False)
QUICK = replace(FULL, quick=True, seconds=3.0, consume_messages=30_000, consume_timeout_s=15.0, drain_s=5.0,
                handshake_s=10.0)


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


def consume(broker: Broker, plan: Plan) -> str:
    queue = "bench.consume"
    conn = setup_conn(broker, plan)
    w = Workers(1)
    sampler: CpuSampler | None = None
    try:
        declare_queue(conn, queue)
        t0 = time.monotonic()
        filled = prefill(conn, queue, plan.consume_messages, plan.consume_timeout_s)
        fill_s = time.monotonic() - t0
        load = SubLoad(plan.prefetch, consume_on_go=True, timeout_s=plan.consume_timeout_s,
                       handshake_s=plan.handshake_s)
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
    return (f"prefetch={plan.prefetch} messages={filled} msgs_per_s={consumed / max(1, last - start) * 1e9:.0f} "
            f"{broker_us(sampler, broker.pid, start, last, consumed)} consumed={consumed} remaining={remaining} "
            f"lost={max(0, filled - consumed - remaining)} "
            f"prefill_s={fill_s:.1f} {cpu_fields(sampler, pids, broker.pid, start, last)} drain={sub['outcome']}")


def fanout_topic(broker: Broker, plan: Plan) -> str:
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
    groups = split(queues, FANOUT_PROCS)
    w = Workers(len(groups))  # consumers first: worker i counts into DELIVERED + i
    sampler: CpuSampler | None = None
    try:
        sub_load = SubLoad(plan.prefetch, consume_on_go=False, timeout_s=plan.seconds + 2 * plan.drain_s,
                           handshake_s=plan.handshake_s, poll_s=FANOUT_POLL_S)
        for group in groups:
            w.start(consumer_worker, broker.port, group, sub_load)
        w.collect("consumer", len(groups), "ready", plan.handshake_s + SLACK_S)
        pub_load = PubLoad(exchange, FANOUT_KEY, confirm=True, window=plan.fanout_window, seconds=plan.seconds,
                           drain_s=plan.drain_s, handshake_s=plan.handshake_s, ahead=plan.fanout_ahead,
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
    return (f"queues={len(queues)} seconds={plan.seconds:g} deliveries_per_s={deliveries / elapsed:.0f} "
            f"{broker_us(sampler, broker.pid, first, last, deliveries, 'delivery')} "
            f"published_per_s={pub['confirmed'] / elapsed:.0f} sent={pub['sent']} confirmed={pub['confirmed']} "
            f"expected={expected} delivered={deliveries} lost={max(0, expected - deliveries)} "
            f"{cpu_fields(sampler, pids, broker.pid, first, last)} drain={drain}" + blocked_note([pub]))


RUNNERS = {"publish_confirm": publish_confirm, "publish": publish, "consume": consume, "fanout_topic": fanout_topic}


# -- main ------------------------------------------------------------------------------------------
class Run:
    """Prints the lines (and appends them to --out) and runs one broker's scenarios."""

    def __init__(self, plan: Plan, out: Any) -> None:
        self.plan = plan
        self.out = out
        self.lines = self.errors = 0
        self.log_offset = 0  # where the current broker's log was when it became ready

    def emit(self, line: str) -> None:
        print(line, flush=True)
        self.out.write(line + "\n")
        self.out.flush()

    def broker(self, name: str, scenarios: list[str]) -> None:
        suffix = " quick=1" if self.plan.quick else ""
        broker: Broker | None = None
        unavailable = ""
        try:
            for scenario in scenarios:
                head = f"amqp broker={name} scenario={scenario}"
                if not unavailable and (broker is None or not broker.alive()):
                    if broker is not None:
                        self.complaints(broker)
                        broker.stop()
                        broker = None
                    try:
                        started = time.monotonic()
                        broker = start_amqp_broker(name)
                        self.log_offset = broker.log_path.stat().st_size if broker.log_path.exists() else 0
                        self.emit(f"# broker={name} server=\"{broker.version}\" port={broker.port} "
                                  f"pid={broker.pid} start_s={time.monotonic() - started:.1f}")
                    except BrokerUnavailable as exc:
                        unavailable = quote(str(exc))
                if unavailable:
                    self.emit(f'{head} skipped reason="{unavailable}"{suffix}')
                    self.lines += 1
                    continue
                assert broker is not None
                try:
                    body = RUNNERS[scenario](broker, self.plan)
                    if not broker.alive():
                        body += f' error="broker exited with status {broker.proc.returncode} during the scenario"'
                except Exception as exc:  # noqa: BLE001 - one failed case must not stop the others
                    known = isinstance(exc, (ScenarioError, AMQPClientError))
                    detail = str(exc) if known else f"{type(exc).__name__}: {exc}"
                    if not broker.alive():
                        detail += f" (broker exited with status {broker.proc.returncode}: {broker.log_tail()})"
                    elif complaints := broker.log_tail(2, complaints_only=True):
                        detail += f" (broker log: {complaints})"
                    body = f'error="{quote(detail)}"'
                self.lines += 1
                self.errors += 'error="' in body
                self.emit(f"{head} {body}{suffix}")
        finally:
            if broker is not None:
                self.complaints(broker)
                broker.stop(timeout_s=30.0)

    def complaints(self, broker: Broker) -> None:
        """The warnings and errors the broker logged since it was ready, if any."""
        try:
            with open(broker.log_path, "rb") as log:
                log.seek(self.log_offset)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            return
        found = [line[:300] for line in lines if ("error" in line.lower() or "warn" in line.lower())
                 and not any(benign in line for benign in BENIGN_LOG_LINES)]
        if found:
            more = f" (+{len(found) - 5} more)" if len(found) > 5 else ""
            self.emit(f'# broker={broker.name} log_complaints="{quote(" | ".join(found[:5]))}"{more}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 s per scenario and 30,000 messages to consume: under 90 s for both brokers")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated, from " + ",".join(BROKERS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from " + ",".join(SCENARIOS))
    parser.add_argument("--out", help="also append the lines to this file")
    args = parser.parse_args()
    brokers = parse_list(args.brokers, BROKERS, "broker")
    scenarios = parse_list(args.scenarios, SCENARIOS, "scenario")
    plan = QUICK if args.quick else FULL
    raise_fd_limit()
    started = time.perf_counter()
    try:
        import importlib.metadata
        tidemq = importlib.metadata.version("tidemq")
    except Exception:  # noqa: BLE001
        tidemq = "?"
    header = (f"# bench_amqp tidemq={tidemq} rabbitmq-server={rabbitmq_version() or 'missing'} "
              f"cores={os.cpu_count()} fd_limit={resource.getrlimit(resource.RLIMIT_NOFILE)[0]} "
              f"body_bytes={len(BODY)} persistent=1 durable=1 tidemq_flush=sync" + (" quick=1" if plan.quick else ""))
    with open(args.out, "a") if args.out else open(os.devnull, "w") as out:
        run = Run(plan, out)
        run.emit(header)
        for name in brokers:
            run.broker(name, scenarios)
        run.emit(f"# {run.lines} lines ({run.errors} with errors) for {','.join(brokers)} in "
                 f"{time.perf_counter() - started:.0f} s on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
