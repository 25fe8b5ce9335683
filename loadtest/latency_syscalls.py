"""Where one AMQP message's time goes at 1,000 msgs/s, seen from outside each broker in the same
terms: the broker's own system calls, traced with ``perf trace`` (root), TideMQ and RabbitMQ alike.

    python -m loadtest.latency_syscalls [--brokers tidemq,rabbitmq] [--seconds 10] [--trace-s 4]

For each broker (started as ``loadtest.brokers.start_amqp_broker`` does, TideMQ with ``--flush
sync``) it runs bench_amqp's latency scenario (its line is printed) and traces the broker's
socket reads and writes for ``--trace-s`` seconds in the middle of it. A read that returns a
whole publish (``PUBLISH_BYTES`` or more) starts a message; the first write after it that
carries a delivery (as many bytes or more) ends it. Printed per broker, medians over the
messages traced: the publish read's return -> the delivery write's entry (the broker's work),
the delivery write's own duration (loopback: it wakes the consumer), and the time since the
broker's previous system call returned (how long it slept before the publish woke it).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

PUBLISH_BYTES = 120  # a publish (method, header and 64-byte body frames) or a delivery is larger; acks and confirms are not
READS = ("read", "readv", "recvfrom", "recvmsg")
WRITES = ("write", "writev", "sendto", "sendmsg")
# perf trace: "  763.711 ( 0.011 ms): name/tid call(fd: 4, ...) = 120"
LINE = re.compile(r"^\s*([0-9.]+) \(\s*([0-9.]*) ms\): [^ ]+/(\d+) (\w+)\(fd: (\d+)[^)]*\)\s+= (-?\d+)")


def trace(pid: int, seconds: float, out: Path) -> None:
    """``perf trace`` of every thread of ``pid``'s socket reads and writes, for ``seconds``."""
    calls = ",".join(READS + WRITES)
    subprocess.run(["perf", "trace", "-p", str(pid), "-e", calls, "-o", str(out), "--", "sleep", str(seconds)],
                   check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def analyse(text: str, sockets: set[int]) -> dict[str, float]:
    """Medians (us) over the traced messages: publish read -> delivery write, the write, the sleep."""
    work, writes, sleeps = [], [], []
    last_return = 0.0
    started: float | None = None  # the return of the publish read being followed (ms)
    slept = 0.0
    for line in text.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        at, took, call, fd, result = float(m[1]), float(m[2] or 0), m[4], int(m[5]), int(m[6])
        if sockets and fd not in sockets:
            continue
        if call in READS and result >= PUBLISH_BYTES:
            started, slept = at + took, at - last_return
        elif call in WRITES and result >= PUBLISH_BYTES and started is not None:
            work.append((at - started) * 1000)
            writes.append(took * 1000)
            sleeps.append(slept * 1000)
            started = None
        last_return = max(last_return, at + took)
    if not work:
        return {}
    return {"messages": len(work), "publish_read_to_delivery_write_us": statistics.median(work),
            "delivery_write_us": statistics.median(writes), "slept_before_publish_us": statistics.median(sleeps)}


def socket_fds(pid: int) -> set[int]:
    """The process's socket descriptors (the commitlog's writes are not a delivery)."""
    fds = set()
    for link in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if Path(link).readlink().as_posix().startswith("socket:"):
                fds.add(int(link.name))
        except OSError:
            continue
    return fds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="tidemq,rabbitmq")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the publisher sends")
    parser.add_argument("--trace-s", type=float, default=4.0, help="how long the broker is traced, from 3 s in")
    args = parser.parse_args()
    from loadtest.brokers import start_amqp_broker
    from loadtest.scenarios import amqp_scenarios

    plan = replace(amqp_scenarios.FULL, latency_seconds=args.seconds)
    for name in args.brokers.split(","):
        broker = start_amqp_broker(name)
        out = Path(tempfile.mkdtemp(prefix="tidemq-syscalls-")) / "trace.txt"
        pid = broker.pid
        sockets: set[int] = set()

        def traced() -> None:
            time.sleep(3.0)  # (the scenario's connections are made by then)
            sockets.update(socket_fds(pid))
            trace(pid, args.trace_s, out)

        tracer = threading.Thread(target=traced)
        try:
            tracer.start()
            print(f"amqp_syscalls broker={name} scenario=latency {amqp_scenarios.latency(broker, plan)}", flush=True)
            tracer.join()
        finally:
            broker.stop()
        figures = analyse(out.read_text() if out.exists() else "", sockets)
        print(f"amqp_syscalls broker={name} " + (" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                                           for k, v in figures.items()) or 'error="nothing traced"'),
              flush=True)


if __name__ == "__main__":
    main()
