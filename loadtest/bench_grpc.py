"""gRPC benchmark: RocketMQ 5 sends and receives over gRPC beside the remoting path, the gateway's CPU per message.

    python -m loadtest.bench_grpc [--quick] [--cases remoting-send,grpc-send,...] [--out FILE]

A fresh TideMQ per case (``python -m gateway serve``, ``--flush async``, the remoting listener
and ``--grpc-bind``; 4 queues a topic); 2 forked load processes. What each case does:

- remoting-send: bench_remoting's send, batch=1 (SEND_MESSAGE_V2, one 128-byte message, 512
  unanswered a connection). Counted: sends answered SUCCESS.
- grpc-send: grpcio's asyncio stub, 64 SendMessage calls in flight a process, each one 128-byte
  NORMAL message built as the official client builds it (message id, born time and host,
  IDENTITY encoding) with its metadata (client id, a request id per call, the date and its
  ``authorization`` signature, with an empty AccessKey: unsigned). Counted: sends answered OK.
- grpc-send-shared: grpc-send through the remoting port (gRPC forwarded over loopback).
- remoting-pop-ack: bench_pop's pop-ack over a filled queue (POP_MESSAGE of 32, one
  ACK_MESSAGE a message). Counted: acks answered SUCCESS.
- grpc-receive-ack: 8 lanes a process, each a ReceiveMessage of 32 (invisible 60 s) then one
  AckMessage a message, as the official SimpleConsumer's user acks them, the 32 in flight
  together. Counted: acks answered OK.

Each line as bench_remoting's:
``grpc case=... msgs_per_s=... broker_cpu_us_per_msg=... messages=... seconds=... gen_cpu_pct=...``;
``broker_cpu_us_per_msg`` is TideMQ's CPU (user + system, every thread: grpcio's too) over the
measured interval per message counted. ``--quick`` runs each case for 2 s.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest import bench_pop, runner
from loadtest.bench_remoting import HOST, PAYLOAD, QUEUES, send_worker
from loadtest.brokers import Broker, free_port, launch
from loadtest.harness import run_timed

TOPIC = "BenchGrpc"
PROCESSES = 2
SEND_WINDOW = 64  # SendMessage calls in flight a process
RECEIVE_LANES = 8  # receive-then-ack loops a process
BATCH = 32
CASES = ("remoting-send", "grpc-send", "grpc-send-shared", "remoting-pop-ack", "grpc-receive-ack")


# -- generator processes (grpcio is imported after the fork: its channels do not survive one) ---
def _metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    """The official client's metadata of one call (Signature.metadata), unsigned."""
    import hmac
    import uuid
    from datetime import datetime
    from hashlib import sha1
    now = datetime.now().strftime("%Y%m%dT%H%M%SZ")
    signature = hmac.new(b"", now.encode(), sha1).hexdigest()
    return (("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"), ("x-mq-client-version", "5.1.2"),
            ("x-mq-date-time", now), ("x-mq-request-id", str(uuid.uuid4())), ("x-mq-client-id", client_id),
            ("x-mq-namespace", ""),
            ("authorization", f"MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature={signature}"))


def grpc_send_worker(index: int, port: int, duration: float, go: Any, results: Any) -> None:
    import asyncio

    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as rpc
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    client_id = f"bench@{os.getpid()}"

    def request(n: int) -> Any:
        message = pb.Message(topic=pb.Resource(name=TOPIC), body=PAYLOAD)
        system = message.system_properties
        system.message_id = f"01{os.getpid():08X}{n:016X}"
        system.message_type = pb.NORMAL
        system.born_timestamp.GetCurrentTime()
        system.born_host = HOST
        system.body_encoding = pb.IDENTITY
        return rpc.SendMessageRequest(messages=[message])

    async def run() -> None:
        async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
            stub = MessagingServiceStub(channel)
            await channel.channel_ready()
            go.wait()
            start = time.monotonic()
            deadline = start + duration
            ok = 0
            numbers = iter(range(1 << 62))

            async def lane() -> None:
                nonlocal ok
                while time.monotonic() < deadline:
                    reply = await stub.SendMessage(request(next(numbers)), metadata=_metadata(client_id))
                    ok += reply.status.code == pb.OK
            await asyncio.gather(*(lane() for _ in range(SEND_WINDOW)))
            results.put((ok, start, time.monotonic()))
    asyncio.run(run())


def grpc_receive_worker(index: int, port: int, duration: float, go: Any, results: Any) -> None:
    import asyncio

    import grpc
    from google.protobuf.duration_pb2 import Duration
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as rpc
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    client_id = f"bench@{os.getpid()}"
    group, topic = pb.Resource(name=bench_pop.GROUP), pb.Resource(name=bench_pop.TOPIC)
    receive = rpc.ReceiveMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=topic, id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=BATCH,
        invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=0))

    async def run() -> None:
        async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
            stub = MessagingServiceStub(channel)
            await channel.channel_ready()
            go.wait()
            start = time.monotonic()
            deadline = start + duration
            acked = 0

            async def ack(message: Any) -> None:
                nonlocal acked
                reply = await stub.AckMessage(rpc.AckMessageRequest(group=group, topic=topic, entries=[
                    rpc.AckMessageEntry(message_id=message.system_properties.message_id,
                                        receipt_handle=message.system_properties.receipt_handle)]),
                    metadata=_metadata(client_id))
                acked += reply.status.code == pb.OK

            async def lane() -> None:
                while time.monotonic() < deadline:
                    answers = [a async for a in stub.ReceiveMessage(receive, metadata=_metadata(client_id))]
                    messages = [a.message for a in answers if a.HasField("message")]
                    if not messages:
                        return  # (the fill is consumed)
                    await asyncio.gather(*(ack(m) for m in messages))
            await asyncio.gather(*(lane() for _ in range(RECEIVE_LANES)))
            results.put((acked, start, time.monotonic()))
    asyncio.run(run())


# -- the broker ------------------------------------------------------------------------------
def start_tidemq() -> tuple[Broker, int]:
    """TideMQ with remoting and gRPC; and its remoting port."""
    remoting_port, grpc_port = free_port(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix="tidemq-bench-grpc-"))
    command = [sys.executable, "-m", "gateway", "serve", "--data-dir", str(workdir / "data"), "--mqtt-bind", "",
               "--amqp-bind", "", "--remoting-bind", f"{HOST}:{remoting_port}", "--grpc-bind", f"{HOST}:{grpc_port}",
               "--flush", "async"]
    env = {**os.environ, "TIDEMQ_REMOTING_DEFAULT_QUEUES": str(QUEUES)}
    # (listening on the gRPC port, started after the remoting one: both are up)
    return launch("tidemq", grpc_port, command, workdir, workdir / "console.log", env), remoting_port


def create_topic(port: int) -> None:
    """The send topic made before the clock starts (a route query would make it: a remoting send does)."""
    with socket.create_connection((HOST, port)) as sock:
        from loadtest.bench_remoting import FrameScanner, send_frame
        from loadtest.clients.mqtt_wire import receive
        sock.sendall(send_frame(TOPIC, 0, 1))
        scanner = FrameScanner()
        while not scanner.feed(receive(sock)):
            pass


def run_case(case: str, duration: float, quick: bool) -> str:
    broker, remoting_port = start_tidemq()
    grpc_port = broker.port
    try:
        fill_count = 0
        if case in ("remoting-send", "grpc-send", "grpc-send-shared"):
            create_topic(remoting_port)
            jobs: list[tuple[Any, tuple]] = [
                (send_worker, (i, remoting_port, 1, duration)) if case == "remoting-send"
                else (grpc_send_worker, (i, remoting_port if case == "grpc-send-shared" else grpc_port, duration))
                for i in range(PROCESSES)]
        else:
            fill_count = (40_000 if quick else 200_000) // 32 * 32
            bench_pop.fill(remoting_port, fill_count)
            jobs = [(bench_pop.pop_worker, (i, remoting_port, False, duration)) if case == "remoting-pop-ack"
                    else (grpc_receive_worker, (i, grpc_port, duration)) for i in range(PROCESSES)]
        timed = run_timed(jobs, broker.pid, duration + 60)
        return (f"grpc case={case} msgs_per_s={timed.count / timed.seconds:.0f} "
                f"broker_cpu_us_per_msg={timed.us_per_msg:.2f} messages={timed.count} fill={fill_count} "
                f"seconds={timed.seconds:.2f} processes={PROCESSES} quick={int(quick)} {timed.cpu}")
    except Exception as exc:  # noqa: BLE001 -- the run goes on with the next case
        return f'grpc case={case} error="{type(exc).__name__}: {exc}" log="{broker.log_tail()}"'
    finally:
        broker.stop()


def main() -> None:
    parser = runner.parser(__doc__, quick="2 s per case")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--duration", type=float, default=None, help="seconds per case (default 10, quick 2)")
    args = parser.parse_args()
    duration = args.duration or (2.0 if args.quick else 10.0)
    with runner.Lines(args.out) as out:
        for case in args.cases.split(","):
            if case not in CASES:
                parser.error(f"unknown case {case!r}")
            out.emit(run_case(case, duration, args.quick))


if __name__ == "__main__":
    main()
