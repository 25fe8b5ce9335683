"""RocketMQ remoting benchmark: sends and pulls against TideMQ's remoting listener.

    python -m loadtest.bench_remoting [--quick] [--scenarios send,pull] [--batches 1,32] [--out FILE]

A fresh TideMQ (``python -m gateway serve``, only the remoting listener, ``--flush async`` as
RocketMQ's default ASYNC_FLUSH) on a free 127.0.0.1 port per scenario. The load generator is
2 forked processes on raw sockets with frames pre-encoded once by ``protocols.remoting``; it
parses only frame lengths of what comes back (and, for pulls, the message sizes in the body),
so its CPU stays well below the broker's -- every line prints both.

- send: each process keeps ``window`` requests unanswered on one connection to topic
  BenchSend (4 queues, the process picks queue = its index): SEND_MESSAGE_V2 with one
  128-byte message (batch=1) or SEND_BATCH_MESSAGE with 32 of them (batch=32). Counted:
  messages whose send was answered SUCCESS, per second, over ``duration`` seconds.
- pull: the topic BenchPull is filled first (batch sends), then each process pulls its two
  queues from offset 0 with maxMsgNums 1 or 32, keeping 64 pulls in flight at known offsets.
  Counted: messages received, per second, until the fill is read or ``duration`` ends.

One line per case:

    remoting scenario=send batch=1 msgs_per_s=... broker_cpu_us_per_msg=... messages=... seconds=...
        gen_cpu_pct=... broker_cpu_pct=... other_cpu_pct=...

100 % CPU is one core; ``other_cpu_pct`` is the rest of the machine (high means a noisy run).
``broker_cpu_us_per_msg``: TideMQ's CPU seconds (user + system) over the measured interval,
widened to psutil's 0.1 s samples, in microseconds, divided by the messages counted in it (a
batch of 32 counts 32).
``--quick`` runs each case for 2 s (under 90 s in all).
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest import runner
from loadtest.brokers import Broker, free_port, launch
from loadtest.clients.mqtt_wire import receive
from loadtest.harness import run_timed
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import RemotingCommand, decode_frame, encode
from protocols.remoting.properties import BatchItem, encode_batch_body

HOST = "127.0.0.1"
PAYLOAD = b"x" * 128
PROCESSES = 2
QUEUES = 4
SEND_WINDOW = {1: 512, 32: 32}
PULL_WINDOW = 64
_U32 = struct.Struct(">I")


# -- frames ----------------------------------------------------------------------------------
def send_frame(topic: str, queue_id: int, batch: int) -> bytes:
    ext = {"a": "bench", "b": topic, "c": "TBW102", "d": str(QUEUES), "e": str(queue_id), "f": "0",
           "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false"}
    if batch == 1:
        return encode(RemotingCommand(RequestCode.SEND_MESSAGE_V2, 1, 0, ext, PAYLOAD))
    body = encode_batch_body([BatchItem(body=PAYLOAD, properties="", flag=0) for _ in range(batch)])
    return encode(RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, 1, 0, {**ext, "m": "true"}, body))


def pull_frame(topic: str, queue_id: int, offset: int, batch: int) -> bytes:
    ext = {"consumerGroup": "bench", "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
           "maxMsgNums": str(batch), "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
           "subscription": "*", "subVersion": "0"}
    return encode(RemotingCommand(RequestCode.PULL_MESSAGE, 1, 0, ext))


class FrameScanner:
    """Splits the byte stream into frames by their length prefix, nothing more."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        frames = []
        pos = 0
        buf = self.buf
        while len(buf) - pos >= 4:
            (length,) = _U32.unpack_from(buf, pos)
            if len(buf) - pos - 4 < length:
                break
            frames.append(bytes(buf[pos + 4:pos + 4 + length]))
            pos += 4 + length
        del buf[:pos]
        return frames


def response_code(frame: bytes) -> int:
    """The code of a response frame without decoding the whole JSON header."""
    header_len = _U32.unpack_from(frame, 0)[0] & 0xFFFFFF
    header = frame[4:4 + header_len]
    at = header.find(b'"code":')
    if at < 0:
        return decode_frame(frame).code
    end = at + 7
    while header[end:end + 1].isdigit() or header[end:end + 1] == b"-":
        end += 1
    return int(header[at + 7:end])


def count_messages(frame: bytes) -> int:
    """Messages in a pull response body: walk their total-size fields."""
    header_len = _U32.unpack_from(frame, 0)[0] & 0xFFFFFF
    body = memoryview(frame)[4 + header_len:]
    count = at = 0
    while at + 4 <= len(body):
        at += _U32.unpack_from(body, at)[0]
        count += 1
    return count


# -- generator processes ---------------------------------------------------------------------
def connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small pulls must not wait for Nagle
    return sock


def send_worker(index: int, port: int, batch: int, duration: float, go: Any, results: Any) -> None:
    sock = connect(port)
    frame = send_frame("BenchSend", index % QUEUES, batch)
    window = SEND_WINDOW[batch]
    scanner = FrameScanner()
    go.wait()
    start = time.monotonic()
    deadline = start + duration
    sent = answered = ok = 0
    while True:
        now = time.monotonic()
        if now < deadline and sent - answered < window:
            room = window - (sent - answered)
            sock.sendall(frame * room)
            sent += room
        if answered >= sent:
            break
        for reply in scanner.feed(receive(sock)):
            answered += 1
            if response_code(reply) == ResponseCode.SUCCESS:
                ok += 1
    results.put((ok * batch, start, time.monotonic()))
    sock.close()


def pull_worker(index: int, port: int, batch: int, duration: float, fill_per_queue: int, go: Any,
                results: Any) -> None:
    sock = connect(port)
    queues = [q for q in range(QUEUES) if q % PROCESSES == index]
    offsets = {q: 0 for q in queues}
    scanner = FrameScanner()
    go.wait()
    start = time.monotonic()
    deadline = start + duration
    in_flight = received = 0

    def more() -> bytes:
        nonlocal in_flight
        out = []
        for q in queues:
            while offsets[q] < fill_per_queue and in_flight < PULL_WINDOW:
                out.append(pull_frame("BenchPull", q, offsets[q], batch))
                offsets[q] += batch
                in_flight += 1
        return b"".join(out)

    while True:
        if time.monotonic() < deadline:
            data = more()
            if data:
                sock.sendall(data)
        if in_flight == 0:
            break
        for reply in scanner.feed(receive(sock)):
            in_flight -= 1
            received += count_messages(reply)
    results.put((received, start, time.monotonic()))
    sock.close()


# -- the broker ------------------------------------------------------------------------------
def start_tidemq() -> Broker:
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-bench-remoting-"))
    log_path = workdir / "console.log"
    command = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(workdir / "data"), "--mqtt-bind", "",
               "--amqp-bind", "", "--remoting-bind", f"{HOST}:{port}", "--flush", "async"]
    env = {**os.environ, "TIDEMQ_REMOTING_DEFAULT_QUEUES": str(QUEUES)}
    return launch("tidemq", port, command, workdir, log_path, env)


def fill(port: int, per_queue: int) -> None:
    """Put ``per_queue`` messages into every queue of BenchPull (batches of 32, pipelined)."""
    sock = connect(port)
    scanner = FrameScanner()
    frames = [send_frame("BenchPull", q, 32) for q in range(QUEUES)]
    batches = per_queue // 32
    sent = answered = 0
    total = batches * QUEUES
    while answered < total:
        if sent < total and sent - answered < 64:
            k = min(64 - (sent - answered), total - sent)
            sock.sendall(b"".join(frames[(sent + i) % QUEUES] for i in range(k)))
            sent += k
        answered += len(scanner.feed(receive(sock)))
    sock.close()


def run_case(scenario: str, batch: int, duration: float, quick: bool) -> str:
    broker = start_tidemq()
    try:
        fill_per_queue = 0
        if scenario == "pull":
            fill_per_queue = (40_000 if quick else 250_000) // 32 * 32
            fill(broker.port, fill_per_queue)
        target = send_worker if scenario == "send" else pull_worker
        extra = () if scenario == "send" else (fill_per_queue,)
        timed = run_timed([(target, (i, broker.port, batch, duration, *extra)) for i in range(PROCESSES)],
                          broker.pid, duration + 60)
        return (f"remoting scenario={scenario} batch={batch} msgs_per_s={timed.count / timed.seconds:.0f} "
                f"broker_cpu_us_per_msg={timed.us_per_msg:.2f} messages={timed.count} "
                f"seconds={timed.seconds:.2f} processes={PROCESSES} quick={int(quick)} {timed.cpu}")
    except Exception as exc:  # the run goes on with the next case
        return f'remoting scenario={scenario} batch={batch} error="{type(exc).__name__}: {exc}" log="{broker.log_tail()}"'
    finally:
        broker.stop()


def main() -> None:
    parser = runner.parser(__doc__, quick="2 s per case")
    parser.add_argument("--scenarios", default="send,pull")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--duration", type=float, default=None, help="seconds per case (default 10, quick 2)")
    args = parser.parse_args()
    duration = args.duration or (2.0 if args.quick else 10.0)
    with runner.Lines(args.out) as out:
        for scenario in args.scenarios.split(","):
            if scenario not in ("send", "pull"):
                parser.error(f"unknown scenario {scenario!r}")
            for batch in (int(b) for b in args.batches.split(",")):
                if batch not in (1, 32):
                    parser.error("batches are 1 or 32")
                out.emit(run_case(scenario, batch, duration, args.quick))


if __name__ == "__main__":
    main()
