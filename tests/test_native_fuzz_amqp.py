"""Random and damaged AMQP frames on a live listener of a gateway process (the compiled reader in
the suite's compiled run): a bug in C code takes the process down where Python raised, and a
decoder that never returns stops the event loop; the process must survive every connection, log
no error, and serve a real client afterwards."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pika
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from protocols.amqp.frames import PROTOCOL_HEADER

from .crash_support import seeded_random
from .fuzz_support import fuzzed_gateway, mutate, send_and_drain

CONNECTIONS = 200  # bounded: ~10 s on a loaded 2-core machine

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
    send_and_drain(port, data, rng)


def test_random_and_damaged_amqp_frames_never_take_the_gateway_down(tmp_path: Path) -> None:
    rng = seeded_random("test_random_and_damaged_amqp_frames_never_take_the_gateway_down")
    with fuzzed_gateway(tmp_path, "amqp") as (port, alive):
        for _ in range(CONNECTIONS):
            attack(port, rng)
            alive()
        params = pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=5, socket_timeout=5)
        with pika.BlockingConnection(params) as conn:
            channel = conn.channel()
            channel.queue_declare("after-fuzz")
            channel.confirm_delivery()
            channel.basic_publish("", "after-fuzz", b"still here", pika.BasicProperties(headers={"k": "v"}))
            _, properties, body = channel.basic_get("after-fuzz", auto_ack=True)
            assert body == b"still here" and properties.headers == {"k": "v"}
