"""Random and damaged MQTT frames on a live listener of a gateway process (the compiled build
in the suite's compiled run): a bug in C code takes the process down where Python raised, so
the process must survive every frame, log no error, and serve a real client afterwards."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

from protocols.mqtt.codec import encode
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Subscription,
    Unsubscribe,
)
from protocols.mqtt.properties import Properties

from .crash_support import ROOT, free_port, seeded_random, stop
from .mqtt_support import PahoClient

CONNECTIONS = 240  # bounded: ~10 s on a loaded 2-core machine
READ_S = 0.05


def frames(version: int) -> list[bytes]:
    """Valid frames of every kind a client sends, the mutation corpus."""
    props = Properties(user_properties=[("k", "v")], message_expiry_interval=60) if version == MQTT_5 else Properties()
    return [encode(p, version) for p in (
        Publish("fuzz/a", b"x" * 20, 0), Publish("fuzz/b", b"y" * 300, 1, packet_id=5, properties=props),
        Publish("fuzz/c", b"", 2, True, packet_id=6), PubAck(5), PubRec(6), PubRel(6), PingReq(),
        Subscribe(9, [Subscription("fuzz/#", 1)]), Unsubscribe(10, ["fuzz/#"]), Disconnect(),
    )]


def mutate(rng: random.Random, data: bytes) -> bytes:
    wire = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(wire) + 1)
        action = rng.choice(("set", "insert", "delete", "cut", "repeat"))
        if action == "set" and at < len(wire):
            wire[at] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif action == "insert":
            wire[at:at] = rng.randbytes(rng.randint(1, 8))
        elif action == "delete" and at < len(wire):
            del wire[at:at + rng.randint(1, 4)]
        elif action == "cut":
            del wire[at:]
        elif action == "repeat":
            wire[at:at] = wire[:at][-16:]
    return bytes(wire)


def attack(port: int, rng: random.Random) -> None:
    version = rng.choice((MQTT_3_1_1, MQTT_5))
    corpus = frames(version)
    kind = rng.random()
    if kind < 0.15:
        data = rng.randbytes(rng.randint(1, 400))  # garbage before any CONNECT
    elif kind < 0.3:
        data = mutate(rng, encode(Connect(f"fz{rng.randrange(99)}", version), version))
    else:
        body = b"".join(rng.choice(corpus) for _ in range(rng.randint(1, 8)))
        data = encode(Connect(f"fz{rng.randrange(99)}", version), version) + mutate(rng, body)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        try:
            for at in range(0, len(data), rng.choice((1, 7, 64, 4096))):
                sock.sendall(data[at:at + rng.choice((1, 7, 64, 4096))])
            sock.settimeout(READ_S)
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionError):
            pass  # the server waits for more, or closed the connection: both are answers


async def test_random_and_damaged_frames_never_take_the_gateway_down(tmp_path: Path) -> None:
    rng = seeded_random("test_random_and_damaged_frames_never_take_the_gateway_down")
    port = free_port()
    log = tmp_path / "gateway.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path / "data"),
                                 "--mqtt-bind", f"127.0.0.1:{port}", "--amqp-bind", "", "--remoting-bind", "",
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
        sub, pub = PahoClient(port, "fuzz-sub"), PahoClient(port, "fuzz-pub")
        await sub.connect()
        await sub.subscribe("after/fuzz", 1)
        await pub.connect()
        await pub.publish("after/fuzz", "still here", 1)
        assert [m.payload for m in await sub.receive(1)] == [b"still here"]
        await sub.disconnect()
        await pub.disconnect()
    finally:
        stop(proc)
    text = log.read_text()
    assert "Traceback" not in text and "level=error" not in text, text[-3000:]
