"""Random and damaged AMQP frames on a live listener of a gateway process (the compiled reader in
the suite's compiled run): a bug in C code takes the process down where Python raised, and a
decoder that never returns stops the event loop; the process must survive every connection, log
no error, and serve a real client afterwards."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pika
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from protocols.amqp.frames import PROTOCOL_HEADER

from .crash_support import ROOT, free_port, seeded_random, stop
from .test_native_fuzz import mutate

CONNECTIONS = 200  # bounded: ~10 s on a loaded 2-core machine
READ_S = 0.05

LOGIN = PROTOCOL_HEADER + b"".join(pframe.marshal(m, 0) for m in (
    commands.Connection.StartOk(client_properties={"product": "fuzz"}, response="\x00guest\x00guest"),
    commands.Connection.TuneOk(2047, 131072, 0), commands.Connection.Open("/"))) + b"".join(
    pframe.marshal(m, 1) for m in (commands.Channel.Open(), commands.Queue.Declare(queue="fuzz"),
                                   commands.Confirm.Select()))


def publish(body: bytes, properties: commands.Basic.Properties) -> bytes:
    return (pframe.marshal(commands.Basic.Publish(routing_key="fuzz"), 1)
            + pframe.marshal(pheader.ContentHeader(0, len(body), properties), 1) + pframe.marshal(ContentBody(body), 1))


CORPUS = [
    publish(b"x" * 20, commands.Basic.Properties(delivery_mode=2)),
    publish(b"y" * 300, commands.Basic.Properties(
        content_type="text/plain", message_id="m1", timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        headers={"a": 1, "b": [True, "s", {"c": 2.5}], "d": bytearray(b"raw")}, expiration="60000", priority=3)),
    publish(b"", commands.Basic.Properties()),
    pframe.marshal(commands.Basic.Ack(1), 1), pframe.marshal(commands.Basic.Qos(prefetch_count=5), 1),
    pframe.marshal(commands.Queue.Bind(queue="fuzz", exchange="amq.topic", routing_key="f.#"), 1),
    pframe.marshal(commands.Exchange.Declare(exchange="fx", exchange_type="headers", arguments={"x": [1, "y"]}), 1),
]


def attack(port: int, rng: random.Random) -> None:
    kind = rng.random()
    if kind < 0.1:
        data = rng.randbytes(rng.randint(1, 400))  # garbage instead of the protocol header
    elif kind < 0.25:
        data = mutate(rng, LOGIN)
    else:
        data = LOGIN + mutate(rng, b"".join(rng.choice(CORPUS) for _ in range(rng.randint(1, 8))))
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        try:
            step = rng.choice((1, 7, 64, 4096))
            for at in range(0, len(data), step):
                sock.sendall(data[at:at + step])
            sock.settimeout(READ_S)
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionError):
            pass  # the server waits for more, or closed the connection: both are answers


def test_random_and_damaged_amqp_frames_never_take_the_gateway_down(tmp_path: Path) -> None:
    rng = seeded_random("test_random_and_damaged_amqp_frames_never_take_the_gateway_down")
    port = free_port()
    log = tmp_path / "gateway.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path / "data"),
                                 "--amqp-bind", f"127.0.0.1:{port}", "--mqtt-bind", "", "--remoting-bind", "",
                                 "--flush", "async"], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=dict(os.environ))
    try:
        deadline = time.monotonic() + 30
        while "gateway ready" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        for _ in range(CONNECTIONS):
            attack(port, rng)
            assert proc.poll() is None, f"the gateway died (status {proc.returncode}): {log.read_text()[-2000:]}"
        params = pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=5, socket_timeout=5)
        with pika.BlockingConnection(params) as conn:
            channel = conn.channel()
            channel.queue_declare("after-fuzz")
            channel.confirm_delivery()
            channel.basic_publish("", "after-fuzz", b"still here", pika.BasicProperties(headers={"k": "v"}))
            _, properties, body = channel.basic_get("after-fuzz", auto_ack=True)
            assert body == b"still here" and properties.headers == {"k": "v"}
    finally:
        stop(proc)
    text = log.read_text()
    assert "Traceback" not in text and "level=error" not in text, text[-3000:]
