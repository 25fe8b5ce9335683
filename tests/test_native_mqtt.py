"""Differential tests of the compiled MQTT codec and delivery encoder: the C extension and the
interpreted reference (the same ``.py``) give the same packets, bytes and errors for valid,
random and damaged input, whatever the chunks it arrives in."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.interop import MQTT_FLAG, RETAIN_FLAG
from protocols.mqtt.packets import MQTT_3_1_1, MQTT_5, Connect, Publish
from store import StoredMessage
from store import encode_properties as encode_store_properties

from .mqtt_strategies import packet_id, packets, props, publishes
from .native_support import compiled, damage, interpreted, outcome, split

READER, WRITER, MESSAGES = "protocols.mqtt.reader", "protocols.mqtt.writer", "gateway.mqtt.messages"
VERSIONS = [MQTT_3_1_1, MQTT_5]


def both(name: str) -> tuple[ModuleType, ModuleType]:
    return compiled(name), interpreted(name)


def read(module: ModuleType, chunks: list[bytes], version: int | None, max_packet_size: int) -> list[Any]:
    """Feed ``chunks`` one by one; every packet, the error that ended the stream, and the state."""
    reader = module.PacketReader(max_packet_size=max_packet_size, version=version)
    seen: list[Any] = []
    for chunk in chunks:
        reader.feed(chunk)
        try:
            seen.extend(reader.packets())
        except Exception as exc:  # noqa: BLE001
            seen.append((type(exc), str(exc)))
            break
    seen.append(("state", reader.buffered, reader.version))
    return seen


def assert_same_reading(chunks: list[bytes], version: int | None, max_packet_size: int = 1 << 20) -> None:
    fast, reference = both(READER)
    assert read(fast, chunks, version, max_packet_size) == read(reference, chunks, version, max_packet_size)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_encode_gives_the_same_bytes(version: int, data: st.DataObject) -> None:
    fast, reference = both(WRITER)
    packet = data.draw(packets(version))
    assert outcome(fast.encode, packet, version) == outcome(reference.encode, packet, version)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_publish_templates_render_the_same_bytes(version: int, data: st.DataObject) -> None:
    fast, reference = both(WRITER)
    topic = data.draw(st.text(max_size=30))
    payload = data.draw(st.one_of(st.binary(max_size=64), st.binary(min_size=120, max_size=20_000)))
    args = (topic, payload, data.draw(st.integers(0, 2)), data.draw(st.booleans()), version,
            data.draw(props("publish", version)))
    mine, theirs = fast.PublishTemplate.of(*args), reference.PublishTemplate.of(*args)
    for _ in range(3):
        pid, dup = data.draw(st.none() | packet_id), data.draw(st.booleans())
        assert outcome(mine.render, pid, dup) == outcome(theirs.render, pid, dup)


@given(first=st.integers(0, 255), length=st.integers(-5, (1 << 28) + 5))
def test_fixed_headers_are_the_same(first: int, length: int) -> None:
    fast, reference = both(WRITER)
    assert outcome(fast.fixed_header, first, length) == outcome(reference.fixed_header, first, length)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_streams_of_valid_packets_read_the_same_in_any_chunks(version: int, data: st.DataObject) -> None:
    _, reference = both(WRITER)
    stream = data.draw(st.lists(packets(version).filter(lambda p: not isinstance(p, Connect)), max_size=6))
    wire = b"".join(reference.encode(p, version) for p in stream)
    assert_same_reading(split(wire, data.draw(st.lists(st.integers(0, 1 << 16), max_size=4))), version)


@pytest.mark.parametrize("version", [None, MQTT_3_1_1, MQTT_5])
@settings(max_examples=500)
@given(blob=st.binary(max_size=300), max_packet_size=st.sampled_from([2, 64, 256, 1 << 20]))
def test_random_bytes_read_the_same(version: int | None, blob: bytes, max_packet_size: int) -> None:
    assert_same_reading([blob], version, max_packet_size)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_frames_read_the_same(version: int, data: st.DataObject) -> None:
    """Valid frames with bytes changed, inserted, removed, or cut, CONNECT first or not."""
    _, reference = both(WRITER)
    packet = data.draw(packets(version))
    wire = damage(data, reference.encode(packet, version))
    wire = wire[:data.draw(st.integers(0, len(wire)))]
    assert_same_reading([wire], None if isinstance(packet, Connect) else version)


def test_a_long_seeded_mutation_run_reads_the_same() -> None:
    """Many frames at once (a bounded loop, seeded): PUBLISH and PUBACK shapes of the fast path
    with every single byte of their headers set to every interesting value."""
    _, reference = both(WRITER)
    rng = random.Random(21)
    frames = [reference.encode(Publish("a/b", b"payload", qos, False, False, 7 if qos else None), v)
              for qos in (0, 1, 2) for v in VERSIONS]
    for frame in frames:
        for at in range(min(len(frame), 12)):
            for value in (0x00, 0x01, 0x02, 0x06, 0x08, 0x30, 0x40, 0x7F, 0x80, 0xC0, 0xFF, rng.randrange(256)):
                damaged = frame[:at] + bytes([value]) + frame[at + 1:]
                for version in VERSIONS:
                    assert_same_reading([damaged], version)
                    assert_same_reading([damaged[:rng.randrange(len(damaged) + 1)]], version)


def delivery_fields(delivery: Any) -> tuple:
    return (delivery.qos, delivery.retain, delivery.props, delivery.expires_at, delivery.body, delivery.raw_properties,
            delivery.publisher)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_deliveries_decode_and_encode_the_same(version: int, data: st.DataObject) -> None:
    """gateway/mqtt/messages.py, the delivery encoder: a PUBLISH made a store message by both
    builds' factories, read back as a StoredMessage, gives the same Delivery and PUBLISH bytes."""
    fast, reference = both(MESSAGES)
    publish = data.draw(publishes(version))
    client_id = data.draw(st.text(max_size=8))
    made = [module.StoreMessageFactory(client_id).message(publish, publish.topic) for module in (fast, reference)]
    assert made[0] == made[1]
    message = made[0]
    properties = (message.encoded_properties if message.encoded_properties is not None
                  else encode_store_properties(message.properties or {}))
    stored = StoredMessage("id", 0, 1, message.topic, message.key or "", message.body, 0,
                           data.draw(st.integers(0, 1 << 42)), properties, b"", 0, flag=data.draw(
                               st.sampled_from([message.flag, message.flag & ~MQTT_FLAG, message.flag | RETAIN_FLAG])))
    mine, theirs = fast.Delivery.of(stored), reference.Delivery.of(stored)
    assert delivery_fields(mine) == delivery_fields(theirs)
    qos, retain = data.draw(st.integers(0, 2)), data.draw(st.booleans())
    variant = (stored.topic, qos, retain, version)
    assert mine.template(*variant).render(9 if qos else None) == theirs.template(*variant).render(9 if qos else None)
    assert mine.remaining_expiry(1e9) == theirs.remaining_expiry(1e9)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_both_builds_take_any_bytes_like_input(kind: type) -> None:
    """A ``bytes`` annotation makes a compiled argument refuse a bytearray or memoryview that the
    interpreted function takes: the reader's feed and the template's payload take all three."""
    reader, writer = both(READER), both(WRITER)
    frames = bytes(reader[1].__name__ and b"\xc0\x00\x40\x02\x00\x07")  # PINGREQ, PUBACK 7
    assert read(reader[0], [kind(frames)], MQTT_3_1_1, 1 << 20) == read(reader[1], [kind(frames)], MQTT_3_1_1, 1 << 20)
    made = [outcome(lambda m: m.PublishTemplate.of("a/b", kind(b"payload"), 1, False, MQTT_5, None).render(5), m)
            for m in writer]
    assert made[0] == made[1] and made[0][0] == "value"
