"""Micro-benchmark of AMQP's inbound decode: ``FrameReader`` reading a buffer of N basic.publish
+ content header + body frames (fed in socket-sized chunks), then the store message built from
each (``to_store_message``), in the compiled and the interpreted build.

    python -m loadtest.micro_amqp_reader [--messages 100000] [--repeat 5] [--build both|compiled|interpreted]

Each build runs in its own process (``TIDEMQ_PURE_PYTHON`` selects it, tests/builds.py);
the best of ``--repeat`` runs is printed, in microseconds per message, for two kinds of
properties: delivery_mode only (the benchmarks' publish) and a richer set (content type,
message id, timestamp, a headers table).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime

from tests.builds import PURE_PYTHON_ENV, is_compiled, pure_python_selected, select_from_environment

select_from_environment()  # before protocols: the build TIDEMQ_PURE_PYTHON selects (tests/builds.py)

from loadtest import runner
from loadtest.clients.amqp_wire import publish_frames
from protocols.amqp import frames, reader

CHUNK = 65_536  # about what one socket read gives


def rich_publish(channel: int, body: bytes) -> bytes:
    from pamqp import commands
    from pamqp import frame as pframe
    from pamqp.body import ContentBody
    from pamqp.header import ContentHeader
    properties = commands.Basic.Properties(
        content_type="application/json", delivery_mode=2, message_id="msg-0001", correlation_id="c-1",
        timestamp=datetime(2026, 11, 24, tzinfo=UTC), headers={"tenant": "acme", "attempt": 1, "ok": True})
    return (pframe.marshal(commands.Basic.Publish(exchange="", routing_key="bench.q"), channel)
            + pframe.marshal(ContentHeader(0, len(body), properties), channel) + pframe.marshal(ContentBody(body), channel))


def read_all(wire: bytes, chunks: list[bytes]) -> list:
    frame_reader = reader.FrameReader()
    frame_reader.feed(frames.PROTOCOL_HEADER)
    out = list(frame_reader.events())
    for chunk in chunks:
        frame_reader.feed(chunk)
        out.extend(frame_reader.events())
    return out


def best_of(repeat: int, fn) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run_here(messages: int, repeat: int) -> None:
    from gateway.amqp.messages import to_store_message
    build = "interpreted" if pure_python_selected() else "compiled"
    compiled = ",".join(n for n, m in sorted(sys.modules.items()) if n.startswith("protocols.amqp") and is_compiled(m))
    body = b"x" * 64
    for kind, one in (("delivery_mode", publish_frames(1, "", "bench.q", body)), ("rich", rich_publish(1, body))):
        wire = one * messages
        chunks = [wire[i:i + CHUNK] for i in range(0, len(wire), CHUNK)]
        events = read_all(wire, chunks)
        assert len(events) == messages + 1, len(events)
        read_s = best_of(repeat, lambda wire=wire, chunks=chunks: read_all(wire, chunks))
        contents = events[1:]

        def store(contents: list = contents) -> None:
            for e in contents:
                to_store_message(e.method.exchange, e.method.routing_key, e.raw_properties, e.body,
                                 delivery_mode=e.delivery_mode, message_id=e.message_id)
        store_s = best_of(repeat, store)
        print(f"amqp_reader build={build} compiled={compiled or '-'} properties={kind} messages={messages} "
              f"read_us_per_msg={read_s / messages * 1e6:.3f} to_store_us_per_msg={store_s / messages * 1e6:.3f}",
              flush=True)


def main() -> None:
    parser = runner.parser(__doc__, out=False)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--build", choices=["both", "compiled", "interpreted"], default="both")
    args = parser.parse_args()
    if args.build != "both":
        run_here(args.messages, args.repeat)
        return
    for build in ("compiled", "interpreted"):
        env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
        if build == "interpreted":
            env[PURE_PYTHON_ENV] = "1"
        subprocess.run([sys.executable, "-m", "loadtest.micro_amqp_reader", "--messages", str(args.messages),
                        "--repeat", str(args.repeat), "--build", build], env=env, check=True)


if __name__ == "__main__":
    main()
