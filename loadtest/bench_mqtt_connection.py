"""Micro-benchmark of the sans-IO MQTT server connection (protocols/mqtt/connection.py) on the
fan-in QoS 1 path, without sockets or the store: microseconds of CPU per message.

    python -m loadtest.bench_mqtt_connection [--messages N] [--repeat R] [--per-read K] [--version 4|5]
    python -m loadtest.bench_mqtt_connection --both     (runs itself compiled, then interpreted)

The build is the process's (``TIDEMQ_PURE_PYTHON=1``: interpreted; tests/builds.py). Cases,
each the best of R runs over N messages, fed K frames per ``receive_data`` (one TCP read):

- reader: PacketReader alone, PUBLISH frames in, packets out (what the connection adds is the
  difference to publish_in);
- publish_in: CONNECT, then QoS 1 PUBLISHes: ``receive_data``, ``events()``,
  ``inbound_publish`` and ``ack_publish`` (the PUBACK bytes), as gateway/mqtt does per message;
- puback_in: a subscriber's PUBACKs for N outbound deliveries: ``receive_data``, ``events()``,
  ``acked`` and the caller's settling (the inflight entry removed).

One line per case: ``mqtt_connection case=C build=B version=V per_read=K us_per_msg=...
compiled_modules=...`` (those of protocols/ the process loaded compiled).
Times are the process's CPU time (time.process_time), not wall time: on a shared machine the
time spent waiting for a core is not the code's. Figures are not tests; take the best of runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.builds import PURE_PYTHON_ENV, compiled_modules, pure_python_selected, select_from_environment

select_from_environment()  # before protocols: the build TIDEMQ_PURE_PYTHON selects (tests/builds.py)

from protocols.mqtt.codec import PacketReader, encode
from protocols.mqtt.connection import ServerConnection
from protocols.mqtt.packets import ConnAck, Connect, PubAck, Publish
from protocols.mqtt.reason_codes import ReasonCode

from loadtest import runner

TOPIC = "sensors/r1/temp"
PAYLOAD = bytes(64)


class Inflight:
    """The caller's record of an unacknowledged delivery (gateway/mqtt's Inflight, reduced)."""

    __slots__ = ("qos", "released")

    def __init__(self, qos: int) -> None:
        self.qos, self.released = qos, False


def packet_ids(n: int) -> list[int]:
    return [i % 65_535 + 1 for i in range(n)]


def reads(frames: list[bytes], per_read: int) -> list[bytes]:
    return [b"".join(frames[i:i + per_read]) for i in range(0, len(frames), per_read)]


def connected(version: int) -> ServerConnection:
    conn = ServerConnection(max_packet_size=1 << 20, receive_maximum=65_535, topic_alias_maximum=64,
                            send_quota=65_535)
    conn.receive_data(encode(Connect("bench", version), version))
    [connect] = list(conn.events())
    conn.accepted(connect)
    conn.send(ConnAck(False, ReasonCode.SUCCESS))
    return conn


def bench_reader(data: list[bytes], version: int) -> float:
    reader = PacketReader(1 << 20, version)
    start = time.process_time()
    for chunk in data:
        reader.feed(chunk)
        for _ in reader.packets():
            pass
    return time.process_time() - start


def bench_publish_in(data: list[bytes], version: int) -> float:
    conn = connected(version)
    awaiting: set[int] = set()
    out: list[bytes] = []
    success = ReasonCode.SUCCESS
    start = time.process_time()
    for chunk in data:
        conn.receive_data(chunk)
        for packet in conn.events():
            if packet.__class__ is Publish:
                conn.inbound_publish(packet, awaiting)
                out.append(conn.ack_publish(packet.qos, packet.packet_id, success, awaiting))
        out.clear()
    elapsed = time.process_time() - start
    assert conn.inbound_unacked == 0
    return elapsed


def bench_puback_in(data: list[bytes], ids: list[int], version: int) -> float:
    conn = connected(version)
    inflight = {pid: Inflight(1) for pid in set(ids)}
    start = time.process_time()
    for chunk in data:
        conn.receive_data(chunk)
        for packet in conn.events():
            if packet.__class__ is PubAck:
                entry = conn.acked(packet, inflight)
                if entry is not None:
                    del inflight[packet.packet_id]
    elapsed = time.process_time() - start
    assert not inflight
    return elapsed


def run(messages: int, repeat: int, per_read: int, version: int) -> None:
    build = "interpreted" if pure_python_selected() else "compiled"
    names = ",".join(name.rpartition(".")[2] for name in compiled_modules()) or "none"
    ids = packet_ids(messages)
    publishes = reads([encode(Publish(TOPIC, PAYLOAD, 1, False, False, pid), version) for pid in ids], per_read)
    pubacks = reads([encode(PubAck(pid), version) for pid in ids], per_read)
    cases = {
        "reader": lambda: bench_reader(publishes, version),
        "publish_in": lambda: bench_publish_in(publishes, version),
        "puback_in": lambda: bench_puback_in(pubacks, ids, version),
    }
    for name, case in cases.items():
        best = min(case() for _ in range(repeat))
        print(f"mqtt_connection case={name} build={build} version={version} per_read={per_read} "
              f"us_per_msg={best / messages * 1e6:.3f} compiled_modules={names}", flush=True)


def main() -> None:
    parser = runner.parser(__doc__, out=False, whole_doc=True)
    parser.add_argument("--messages", type=int, default=50_000, help="at most 65,535 (one packet id each)")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--per-read", type=int, default=16)
    parser.add_argument("--version", type=int, choices=(4, 5), default=4)
    parser.add_argument("--both", action="store_true", help="run compiled, then interpreted (child processes)")
    args = parser.parse_args()
    if not 1 <= args.messages <= 65_535:
        parser.error("--messages is 1..65535")
    if args.both:
        argv = [a for a in sys.argv[1:] if a != "--both"]
        for pure in ("", "1"):
            env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV} | ({PURE_PYTHON_ENV: pure} if pure else {})
            subprocess.run([sys.executable, "-m", "loadtest.bench_mqtt_connection", *argv], env=env, check=True)
        return
    run(args.messages, args.repeat, args.per_read, args.version)


if __name__ == "__main__":
    main()
