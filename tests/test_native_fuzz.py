"""Random and damaged MQTT frames on a live listener of a gateway process (the compiled build
in the suite's compiled run): a bug in C code takes the process down where Python raised, so
the process must survive every frame, log no error, and serve a real client afterwards."""

from __future__ import annotations

import random
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

from .crash_support import seeded_random
from .fuzz_support import fuzzed_gateway, mutate, send_and_drain
from .mqtt_support import PahoClient

CONNECTIONS = 240  # bounded: ~10 s on a loaded 2-core machine


def frames(version: int) -> list[bytes]:
    """Valid frames of every kind a client sends, the mutation corpus."""
    props = Properties(user_properties=[("k", "v")], message_expiry_interval=60) if version == MQTT_5 else Properties()
    return [encode(p, version) for p in (
        Publish("fuzz/a", b"x" * 20, 0), Publish("fuzz/b", b"y" * 300, 1, packet_id=5, properties=props),
        Publish("fuzz/c", b"", 2, True, packet_id=6), PubAck(5), PubRec(6), PubRel(6), PingReq(),
        Subscribe(9, [Subscription("fuzz/#", 1)]), Unsubscribe(10, ["fuzz/#"]), Disconnect(),
    )]


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
    send_and_drain(port, data, rng)


async def test_random_and_damaged_frames_never_take_the_gateway_down(tmp_path: Path) -> None:
    rng = seeded_random("test_random_and_damaged_frames_never_take_the_gateway_down")
    with fuzzed_gateway(tmp_path, "mqtt") as (port, alive):
        for _ in range(CONNECTIONS):
            attack(port, rng)
            alive()
        sub, pub = PahoClient(port, "fuzz-sub"), PahoClient(port, "fuzz-pub")
        await sub.connect()
        await sub.subscribe("after/fuzz", 1)
        await pub.connect()
        await pub.publish("after/fuzz", "still here", 1)
        assert [m.payload for m in await sub.receive(1)] == [b"still here"]
        await sub.disconnect()
        await pub.disconnect()
