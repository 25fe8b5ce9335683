"""Pop benchmark: pop + ack throughput of 4 consumers on one queue, beside plain pull of the same data.

    python -m loadtest.bench_pop [--quick] [--cases pop-ack,pop-batch-ack,pull] [--out FILE]

The harness of bench_remoting (a fresh TideMQ per case, ``--flush async``, only the remoting
listener; forked load processes on raw sockets). Queue 0 of BenchPop is filled first (batch
sends), then:

- pop-ack: 4 processes, one connection each, pop that one queue (POP_MESSAGE, maxMsgNums 32,
  invisibleTime 60 s, two pops in flight) and ack every message as the Java push consumer
  does (one ACK_MESSAGE per message, pipelined). Counted: acks answered SUCCESS.
- pop-batch-ack: the same, one BATCH_ACK_MESSAGE per pop (a bit set of its offsets), as
  RocketMQ 5's proxy acks.
- pull: one process pulls the queue (a queue has one puller in a group: queue-level balance),
  maxMsgNums 32, 64 pulls in flight at known offsets. Counted: messages received.

Each case runs until the fill is consumed or ``duration`` ends. One line per case, as
bench_remoting's: ``pop case=... consumers=... msgs_per_s=... broker_cpu_us_per_msg=... ...``.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

from loadtest import runner
from loadtest.bench_remoting import FrameScanner, connect, count_messages, pull_frame, send_frame, start_tidemq
from loadtest.clients.mqtt_wire import receive
from loadtest.harness import run_timed
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import RemotingCommand, decode_frame, encode

TOPIC = "BenchPop"
GROUP = "bench-pop"
POP_WINDOW = 2
PULL_WINDOW = 64


def pop_frame(opaque: int) -> bytes:
    ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "maxMsgNums": "32", "invisibleTime": "60000",
           "pollTime": "0", "bornTime": "0", "initMode": "0", "expType": "TAG", "exp": "*", "order": "false"}
    return encode(RemotingCommand(RequestCode.POP_MESSAGE, opaque, 0, ext))


def ack_frames(response: RemotingCommand, batch: bool, opaque: int) -> list[bytes]:
    """The acks of one pop's messages, from its response header (startOffsetInfo, msgOffsetInfo)."""
    ext = response.ext_fields
    pop_time, invisible = ext["popTime"], ext["invisibleTime"]
    _, queue_id, start = ext["startOffsetInfo"].split(" ")
    offsets = [int(o) for o in ext["msgOffsetInfo"].split(" ")[2].split(",")]
    if batch:
        bits = 0
        for offset in offsets:
            bits |= 1 << (offset - int(start))
        ack = {"b": base64.b64encode(bits.to_bytes((bits.bit_length() + 7) // 8, "little")).decode(), "c": GROUP,
               "it": int(invisible), "pt": int(pop_time), "q": int(queue_id), "r": "0", "rq": 0, "so": int(start),
               "t": TOPIC}
        body = json.dumps({"acks": [ack], "brokerName": "tidemq"}).encode()
        return [encode(RemotingCommand(RequestCode.BATCH_ACK_MESSAGE, opaque, 0, {}, body))]
    return [encode(RemotingCommand(RequestCode.ACK_MESSAGE, opaque + i, 0, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id, "offset": str(offset),
        "extraInfo": f"{start} {pop_time} {invisible} 0 0 tidemq {queue_id} {offset}"})) for i, offset in enumerate(offsets)]


def pop_worker(index: int, port: int, batch_ack: bool, duration: float, go: Any, results: Any) -> None:
    sock = connect(port)
    scanner = FrameScanner()
    go.wait()
    start = time.monotonic()
    deadline = start + duration
    opaque = index << 24
    pops = acks = acked = 0  # pops in flight, acks in flight, messages acked
    batch_sizes: dict[int, int] = {}  # a batch ack's opaque -> the messages it acks
    drained = False
    while True:
        out = []
        while not drained and pops < POP_WINDOW and time.monotonic() < deadline:
            opaque += 1
            out.append(pop_frame(opaque))
            pops += 1
        if out:
            sock.sendall(b"".join(out))
        if pops == 0 and acks == 0:
            break
        out = []
        for raw in scanner.feed(receive(sock)):
            reply = decode_frame(raw)
            if reply.code == ResponseCode.SUCCESS and "msgOffsetInfo" in reply.ext_fields:
                pops -= 1
                frames = ack_frames(reply, batch_ack, opaque + 1)
                if batch_ack:
                    batch_sizes[opaque + 1] = reply.ext_fields["msgOffsetInfo"].count(",") + 1
                opaque += len(frames)
                acks += len(frames)
                out += frames
            elif reply.code == ResponseCode.POLLING_TIMEOUT:
                pops -= 1
                drained = True  # nothing left to pop: the fill is consumed
            elif batch_ack:
                acks -= 1
                size = batch_sizes.pop(reply.opaque, 0)
                acked += size if reply.code == ResponseCode.SUCCESS else 0
            else:
                acks -= 1
                acked += reply.code == ResponseCode.SUCCESS
        if out:
            sock.sendall(b"".join(out))
    results.put((acked, start, time.monotonic()))
    sock.close()


def pull_worker(port: int, fill_count: int, duration: float, go: Any, results: Any) -> None:
    sock = connect(port)
    scanner = FrameScanner()
    go.wait()
    start = time.monotonic()
    deadline = start + duration
    offset = in_flight = received = 0
    while True:
        out = []
        while offset < fill_count and in_flight < PULL_WINDOW and time.monotonic() < deadline:
            out.append(pull_frame(TOPIC, 0, offset, 32))
            offset += 32
            in_flight += 1
        if out:
            sock.sendall(b"".join(out))
        if in_flight == 0:
            break
        for reply in scanner.feed(receive(sock)):
            in_flight -= 1
            received += count_messages(reply)
    results.put((received, start, time.monotonic()))
    sock.close()


def fill(port: int, count: int) -> None:
    sock = connect(port)
    scanner = FrameScanner()
    frame = send_frame(TOPIC, 0, 32)
    total = count // 32
    sent = answered = 0
    while answered < total:
        if sent < total and sent - answered < 64:
            k = min(64 - (sent - answered), total - sent)
            sock.sendall(frame * k)
            sent += k
        answered += len(scanner.feed(receive(sock)))
    sock.close()


def run_case(case: str, duration: float, quick: bool) -> str:
    broker = start_tidemq()
    consumers = 1 if case == "pull" else 4
    try:
        fill_count = (40_000 if quick else 200_000) // 32 * 32
        fill(broker.port, fill_count)
        jobs = [(pull_worker, (broker.port, fill_count, duration)) if case == "pull"
                else (pop_worker, (i, broker.port, case == "pop-batch-ack", duration)) for i in range(consumers)]
        timed = run_timed(jobs, broker.pid, duration + 60)
        return (f"pop case={case} consumers={consumers} msgs_per_s={timed.count / timed.seconds:.0f} "
                f"broker_cpu_us_per_msg={timed.us_per_msg:.2f} messages={timed.count} fill={fill_count} "
                f"seconds={timed.seconds:.2f} quick={int(quick)} {timed.cpu}")
    except Exception as exc:  # noqa: BLE001 -- the run goes on with the next case
        return f'pop case={case} error="{type(exc).__name__}: {exc}" log="{broker.log_tail()}"'
    finally:
        broker.stop()


def main() -> None:
    parser = runner.parser(__doc__, quick="2 s per case")
    parser.add_argument("--cases", default="pop-ack,pop-batch-ack,pull")
    parser.add_argument("--duration", type=float, default=None, help="seconds per case (default 10, quick 2)")
    args = parser.parse_args()
    duration = args.duration or (2.0 if args.quick else 10.0)
    with runner.Lines(args.out) as out:
        for case in args.cases.split(","):
            if case not in ("pop-ack", "pop-batch-ack", "pull"):
                parser.error(f"unknown case {case!r}")
            out.emit(run_case(case, duration, args.quick))


if __name__ == "__main__":
    sys.exit(main())
