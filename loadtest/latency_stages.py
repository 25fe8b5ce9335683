"""Where one AMQP message's time goes inside TideMQ at 1,000 msgs/s: timestamps at each stage of
its path, publish -> delivery written -> ack read, and publish -> fdatasync -> confirm written.

    python -m loadtest.latency_stages [--seconds 10] [--rate 1000] [--keep FILE]

Starts TideMQ as ``loadtest.brokers.start_amqp_broker`` does (``--flush sync``), but through
this module's ``serve`` entry point, which wraps the stage functions of the running gateway
with ``perf_counter_ns`` stamps before handing over to ``python -m gateway``; then runs
bench_amqp's latency scenario against it (its line is printed too). Messages come one a
millisecond (``--rate``), so each publisher read starts one message's record; every stage stamps the first
time it is reached after that read, in microseconds from the publisher connection's
``data_received``; the first line, negative, is the publisher's send time (the stamp its body
starts with, CLOCK_MONOTONIC) on the same scale: how long the publish took to be read. The
medians (the first 200 messages left out) are printed in the order reached, one line per
stage. The wrappers cost about a microsecond a stage: compare runs of this tool with each
other, and the scenario's own p50 with bench_amqp's (``loadtest.latency_syscalls`` measures
TideMQ and RabbitMQ alike from their system calls).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.clients.stamps import PAYLOAD_SIZE, STAMP

OUT_ENV = "LOADTEST_STAGE_TIMES"  # where the gateway writes the medians (set by main for serve)
SKIP = 200  # the first messages (connections warming up) are left out


class StageClock:
    """One record per message: each stage's first stamp after the message's publish was read."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.t0: int | None = None
        self.read_at = 0
        self.read_at_monotonic = 0
        self.publisher: object | None = None
        self.record: dict[str, float] = {}
        self.records: list[dict[str, float]] = []
        self.sent_ns = 0  # the publisher's send time (CLOCK_MONOTONIC) of the message being followed

    def mark(self, stage: str) -> None:
        if self.t0 is not None and stage not in self.record:
            self.record[stage] = (time.perf_counter_ns() - self.t0) / 1000

    def publish_read(self, connection: object) -> None:
        if self.record:
            self.records.append(self.record)
            if len(self.records) % 500 == 0:
                self.dump()
        self.record = {}
        self.t0 = self.read_at
        self.publisher = connection
        if self.sent_ns:  # (before t0: a negative figure, how long the publish took to be read)
            self.record["client sent the publish"] = (self.sent_ns - self.read_at_monotonic) / 1000

    def dump(self) -> None:
        by_stage: dict[str, list[float]] = {}
        for record in self.records[SKIP:]:
            for stage, us in record.items():
                by_stage.setdefault(stage, []).append(us)
        medians = {stage: [statistics.median(values), len(values)] for stage, values in by_stage.items()}
        with open(self.out, "w") as f:
            json.dump(dict(sorted(medians.items(), key=lambda kv: kv[1][0])), f)


def wrap(owner: Any, name: str, before: str | None, after: str | None, clock: StageClock) -> None:
    """Stamp ``before`` as ``owner.name`` is entered and ``after`` as it returns."""
    real: Callable[..., Any] = getattr(owner, name)

    def stamped(*args: Any, **kwargs: Any) -> Any:
        if before:
            clock.mark(before)
        result = real(*args, **kwargs)
        if after:
            clock.mark(after)
        return result

    setattr(owner, name, stamped)


def install(clock: StageClock) -> None:
    """Wrap the stage functions (all interpreted Python in either build)."""
    from gateway.amqp import broker, channel, connection, inbound, queues
    from gateway.core import ingest
    from store.index import notify
    from store.write import committer, durable

    conn = connection.AMQPConnection
    data_received, flush = conn.data_received, conn.flush

    def data_received_stamped(self: Any, data: bytes) -> None:
        consumer = clock.publisher is not None and self is not clock.publisher
        clock.read_at = time.perf_counter_ns()
        clock.read_at_monotonic = time.monotonic_ns()
        # one stamped publish a read (1,000 msgs/s): its body is the read's last 64 bytes and frame end
        clock.sent_ns = STAMP.unpack_from(data, len(data) - 1 - PAYLOAD_SIZE)[2] if len(data) > PAYLOAD_SIZE else 0
        if consumer:
            clock.mark("ack read")
        data_received(self, data)
        if consumer:
            clock.mark("ack handled")

    def flush_stamped(self: Any) -> None:
        if not self._out or clock.t0 is None:
            flush(self)
        elif self is clock.publisher:
            clock.mark("confirm written")
            flush(self)
        else:
            clock.mark("delivery write starts")
            flush(self)
            clock.mark("delivery write returns")

    conn.data_received, conn.flush = data_received_stamped, flush_stamped  # type: ignore[method-assign]
    receive = inbound.Inbound.receive

    def receive_stamped(self: Any, events: list) -> None:
        clock.publish_read(self.connection)
        clock.mark("frames read")
        receive(self, events)
        clock.mark("put submitted, read done")

    inbound.Inbound.receive = receive_stamped  # type: ignore[method-assign]
    wrap(inbound, "route_publish", "route starts", "routed", clock)
    wrap(ingest.PutPipeline, "submit", "put starts", None, clock)
    wrap(committer.GroupCommitter, "submit", "committer submit", None, clock)
    wrap(committer.GroupCommitter, "_commit", "commit starts", "commit ends", clock)
    wrap(committer.GroupCommitter, "_publish", "commitlog written, dispatch starts", None, clock)
    wrap(notify.NotifyHub, "publish", "index written, notify starts", "notify ends", clock)
    wrap(committer, "put_results", "tail handed, put results", None, clock)
    wrap(broker.AMQPBroker, "_serve_written", "queues served", None, clock)
    wrap(queues.QueueRuntime, "peek", None, "message peeked", clock)
    wrap(channel.Channel, "deliver", "deliver starts", "deliver framed", clock)
    wrap(queues.QueueRuntime, "save", "offset saved", None, clock)
    wrap(durable.SyncFlusher, "_request", "fdatasync asked", None, clock)
    wrap(durable.SyncFlusher, "_on_done", "fdatasync returned", None, clock)
    wrap(inbound.Inbound, "_done", "confirm starts", None, clock)


def serve() -> None:
    """``python -m loadtest.latency_stages serve ...``: the gateway's own CLI (``serve ...``), stamped."""
    clock = StageClock(os.environ[OUT_ENV])
    install(clock)
    atexit.register(clock.dump)
    runpy.run_module("gateway", run_name="__main__", alter_sys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the publisher sends")
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="messages a second, paced (stages are per read: each read must carry one publish)")
    parser.add_argument("--keep", type=Path, help="keep the medians' JSON here")
    args = parser.parse_args()
    from loadtest.brokers import start_amqp_broker
    from loadtest.scenarios import amqp_scenarios

    out = args.keep or Path(tempfile.mkdtemp(prefix="tidemq-stages-")) / "stages.json"
    os.environ[OUT_ENV] = str(out)
    broker = start_amqp_broker("tidemq", module="loadtest.latency_stages")
    try:
        plan = replace(amqp_scenarios.FULL, latency_seconds=args.seconds, latency_rate=args.rate)
        print(f"amqp_stages scenario=latency {amqp_scenarios.latency(broker, plan)}", flush=True)
    finally:
        broker.stop()
    for stage, (us, count) in json.loads(out.read_text()).items():
        print(f"amqp_stage us={us:.1f} messages={count} stage={stage!r}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve()
    else:
        main()
