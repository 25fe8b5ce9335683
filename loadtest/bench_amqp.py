"""AMQP 0-9-1 benchmark: the same workload against TideMQ and RabbitMQ in one run.

    bash scripts/bench-setup.sh && .venv/bin/python -m loadtest.bench_amqp --quick
    python -m loadtest.bench_amqp [--quick] [--brokers tidemq,rabbitmq]
                                  [--scenarios publish_confirm,publish,consume,...,latency (SCENARIOS)]
                                  [--seconds S] [--consume-messages N] [--out FILE]

Brokers (``loadtest.brokers.start_amqp_broker``), one per broker for all its scenarios, each on a
free 127.0.0.1 port and stopped by PID at the end: TideMQ (``python -m gateway serve`` with only
the AMQP listener, ``--flush sync``: a publish is confirmed after fdatasync) and a private
RabbitMQ node from Debian's ``rabbitmq-server`` package (its own epmd, config, data and logs in
a temp dir, no plugins; it fsyncs before confirming persistent messages too). Both get durable
queues and persistent messages (delivery_mode 2); every scenario declares its own queues and
deletes them at its end; a broker that died is started again for the next scenario. A broker
that is not installed or does not start gets ``skipped reason=...`` lines; the other goes on.

Load generator: forked processes on raw sockets (``loadtest.clients.amqp_wire``). pamqp encodes the
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
- consume_ack_each, consume_multiple25, consume_no_ack: the same with other client patterns
  (``acks=`` on the line): a basic.ack per delivery (pika's, aio-pika's, kombu's default), a
  ``multiple`` ack every 25 deliveries, no-ack consumers. ``consume`` itself acks ``multiple``
  once per channel and read (``acks=read``).
- fanout_topic: a durable topic exchange, 100 durable queues bound with the same pattern
  (``bench.fanout.#``), one consumer channel each (prefetch 100, manual acks; 10 channels a
  connection, 2 processes); one confirming publisher (window 100) sends persistent messages
  with routing key ``bench.fanout.msg`` for ``seconds``, staying at most 300 messages ahead of
  the average queue's consumer. ``deliveries_per_s`` = deliveries counted across the 100 queues /
  (first send .. last delivery); ``lost`` = confirmed x 100 - deliveries. Consumers read every
  5 ms here (100 channels share the deliveries: prefetch never binds).
  Manual acks of persistent messages are what RabbitMQ's fan-out deliveries cost most in
  (see BENCHMARKS.md, issue 37): a pattern real consumers use, so it stays, labelled ``acks=read``.
- fanout_topic_ack_each: the same with an ack per delivery and the 100 consumer channels on 2
  connections (50 each). fanout_topic_no_ack: the independent raw-frame generator's pattern:
  no-ack consumers on 2 connections and a publisher keeping 2,000 publishes unconfirmed with
  no bound on how far ahead of the consumers it runs.
- latency: one durable queue, one consumer connection (prefetch 100, manual acks, basic.consume
  before the publisher starts) and one confirming publisher connection paced at 1,000 msgs/s
  (window 1,000: confirms never hold the pace back) for 10 s (3 s with --quick). Each body
  starts with the publisher's send time (``loadtest.clients.stamps``, as bench_mqtt's latency
  scenario; CLOCK_MONOTONIC is one clock for every process); the consumer records send ->
  delivery received for each message. Both read on readiness, not every millisecond.
  ``p50_ms`` / ``p99_ms`` over every message, ``msgs_per_s`` = received / (first send .. last
  delivery), ``lost`` = confirmed - received (unique), ``dup`` = received twice.

``drain`` says how the counting ended: ``complete`` (all expected counted), ``idle`` (nothing
more came for 2 s: what is missing was dropped) or ``timeout`` (still arriving when the drain
bound, 15 s, 5 s with --quick, ran out: what is missing had not arrived yet).

``--quick`` sends for 3 s (consume: 30,000 messages) instead of 15 s (300,000), for both brokers
and all scenarios in well under 90 s (35 s here); its lines say ``quick=1``. One line per (broker, scenario):

    amqp broker=B scenario=publish_confirm ... msgs_per_s=... broker_cpu_us_per_msg=... confirmed=... queued=... lost=0
         gen_cpu=..% broker_cpu=..% other_cpu=..%              (one line)
    amqp broker=B scenario=... error="..."             (the scenario failed; the run goes on)
    amqp broker=B scenario=... skipped reason="..."    (the broker is missing or did not start)

After the brokers, one line per scenario that both ran puts their CPU per message side by side:

    amqp compare scenario=S tidemq_us=... rabbitmq_us=... cpu_ratio=... tidemq_rate=... rabbitmq_rate=... rate_ratio=...

(``cpu_ratio`` = TideMQ's CPU per message / RabbitMQ's; ``rate_ratio`` = TideMQ's rate / RabbitMQ's).

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

import os
import re
import resource
import time
from dataclasses import replace

from loadtest import runner
from loadtest.brokers import (
    Broker,
    BrokerUnavailable,
    ScenarioError,
    rabbitmq_version,
    raise_fd_limit,
    start_amqp_broker,
)
from loadtest.clients.amqp_load import BODY
from loadtest.clients.amqp_wire import AMQPClientError
from loadtest.harness import parse_list, quote
from loadtest.scenarios.amqp_scenarios import FULL, QUICK, RUNNERS, Plan

BROKERS = ("tidemq", "rabbitmq")
SCENARIOS = ("publish_confirm", "publish", "consume", "consume_ack_each", "consume_multiple25", "consume_no_ack",
             "fanout_topic", "fanout_topic_ack_each", "fanout_topic_no_ack", "latency")
# What a fresh broker always logs as a warning: not worth a log_complaints line.
BENIGN_LOG_LINES = ("rebuilding indices from scratch",)  # RabbitMQ's first boot of a message store


# -- main ------------------------------------------------------------------------------------------
class Run:
    """Prints the lines (and appends them to --out) and runs one broker's scenarios."""

    def __init__(self, plan: Plan, out: runner.Lines) -> None:
        self.plan = plan
        self.out = out
        self.lines = self.errors = 0
        self.figures: dict[str, dict[str, tuple[float, float]]] = {}  # scenario -> broker -> (rate, us)
        self.log_offset = 0  # where the current broker's log was when it became ready

    def emit(self, line: str) -> None:
        self.out.emit(line)

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
                figures = rate_and_cpu(body)
                if figures is not None:
                    self.figures.setdefault(scenario, {})[name] = figures
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


def rate_and_cpu(body: str) -> tuple[float, float] | None:
    """A scenario line's rate and broker CPU microseconds per message (or delivery), if it has them."""
    rate = re.search(r"(?:^| )(?:msgs|deliveries)_per_s=([0-9.]+)", body)
    cpu = re.search(r"(?:^| )broker_cpu_us_per_(?:msg|delivery)=([0-9.]+)", body)
    return (float(rate[1]), float(cpu[1])) if rate and cpu else None


def compare_lines(figures: dict[str, dict[str, tuple[float, float]]]) -> list[str]:
    """TideMQ beside RabbitMQ, for each scenario both ran."""
    out = []
    for scenario, by_broker in figures.items():
        if "tidemq" in by_broker and "rabbitmq" in by_broker:
            (t_rate, t_us), (r_rate, r_us) = by_broker["tidemq"], by_broker["rabbitmq"]
            out.append(f"amqp compare scenario={scenario} tidemq_us={t_us:.2f} rabbitmq_us={r_us:.2f} "
                       f"cpu_ratio={t_us / r_us if r_us else 0:.2f} tidemq_rate={t_rate:.0f} "
                       f"rabbitmq_rate={r_rate:.0f} rate_ratio={t_rate / r_rate if r_rate else 0:.2f}")
    return out


def main() -> None:
    parser = runner.parser(__doc__, quick="3 s per scenario and 30,000 messages to consume: under 90 s for both brokers")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated, from " + ",".join(BROKERS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from " + ",".join(SCENARIOS))
    parser.add_argument("--seconds", type=float, help="how long the publishers send (instead of 15, 3 with --quick)")
    parser.add_argument("--consume-messages", type=int, help="messages a consume scenario's queue is filled with "
                        "(instead of 300,000, 30,000 with --quick)")
    args = parser.parse_args()
    brokers = parse_list(args.brokers, BROKERS, "broker")
    scenarios = parse_list(args.scenarios, SCENARIOS, "scenario")
    plan = QUICK if args.quick else FULL
    if args.seconds:
        plan = replace(plan, seconds=args.seconds)
    if args.consume_messages:
        plan = replace(plan, consume_messages=args.consume_messages)
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
    with runner.Lines(args.out) as out:
        run = Run(plan, out)
        run.emit(header)
        for name in brokers:
            run.broker(name, scenarios)
        for line in compare_lines(run.figures):
            run.emit(line)
        run.emit(f"# {run.lines} lines ({run.errors} with errors) for {','.join(brokers)} in "
                 f"{time.perf_counter() - started:.0f} s on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
