"""The MQTT codec: every packet round-trips in 3.1.1 and 5.0; bad bytes raise only MQTTError."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.mqtt.codec import PacketReader, PublishTemplate, encode, fixed_header
from protocols.mqtt.errors import (
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolViolation,
    UnsupportedProtocolVersion,
)
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Connect,
    PingReq,
    Publish,
)
from tests.mqtt_strategies import packet_id, packets, props


def decode_one(data: bytes, version: int, is_connect: bool) -> object:
    reader = PacketReader(version=None if is_connect else version)
    reader.feed(data)
    found = list(reader.packets())
    assert len(found) == 1 and reader.buffered == 0
    return found[0]


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_packet_round_trips(version: int, data: st.DataObject) -> None:
    packet = data.draw(packets(version))
    wire = encode(packet, version)
    assert decode_one(wire, version, isinstance(packet, Connect)) == packet


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_stream_split_anywhere_gives_the_same_packets(version: int, data: st.DataObject) -> None:
    sequence = data.draw(st.lists(packets(version).filter(lambda p: not isinstance(p, Connect)), min_size=1,
                                  max_size=5))
    stream = b"".join(encode(p, version) for p in sequence)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    reader = PacketReader(version=version)
    got = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        reader.feed(stream[start:end])
        got.extend(reader.packets())
    assert got == sequence


@pytest.mark.parametrize("version", [None, MQTT_3_1_1, MQTT_5])
@settings(max_examples=500)
@given(blob=st.binary(max_size=300))
def test_random_bytes_raise_only_codec_errors(version: int | None, blob: bytes) -> None:
    reader = PacketReader(max_packet_size=256, version=version)
    reader.feed(blob)
    try:
        list(reader.packets())
    except MQTTError:
        pass


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_corrupted_bodies_raise_only_codec_errors(version: int, data: st.DataObject) -> None:
    """A valid frame whose body bytes are damaged or cut short inside the frame."""
    packet = data.draw(packets(version))
    wire = bytearray(encode(packet, version))
    header_len = 2 if len(wire) < 2 + 128 else 3  # the generated packets stay below 16 KiB
    body = wire[header_len:]
    if body:
        index = data.draw(st.integers(0, len(body) - 1))
        body[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    frame = fixed_header(wire[0], cut) + bytes(body[:cut])
    reader = PacketReader(version=None if isinstance(packet, Connect) else version)
    reader.feed(frame)
    try:
        list(reader.packets())
    except MQTTError:
        pass


@given(data=st.data())
def test_truncated_packets_wait_for_more(data: st.DataObject) -> None:
    packet = data.draw(packets(MQTT_5))
    wire = encode(packet, MQTT_5)
    cut = data.draw(st.integers(0, len(wire) - 1))
    reader = PacketReader(version=None if isinstance(packet, Connect) else MQTT_5)
    reader.feed(wire[:cut])
    assert list(reader.packets()) == []
    reader.feed(wire[cut:])
    assert list(reader.packets()) == [packet]


def test_oversized_packet_refused_from_its_fixed_header() -> None:
    reader = PacketReader(max_packet_size=1024, version=MQTT_5)
    reader.feed(fixed_header(0x30, 4096))  # only the header has arrived
    with pytest.raises(PacketTooLarge) as err:
        list(reader.packets())
    assert err.value.reason_code == 0x95


def test_remaining_length_of_five_bytes_is_malformed() -> None:
    reader = PacketReader(version=MQTT_5)
    reader.feed(b"\x30\xff\xff\xff\xff\x01")
    with pytest.raises(MalformedPacket):
        list(reader.packets())


@pytest.mark.parametrize("wire, error", [
    (b"\x30\x03\x00\x01a", None),  # a valid QoS 0 publish (control case)
    (b"\x36\x05\x00\x01a\x00\x01", MalformedPacket),  # QoS 3
    (b"\x38\x03\x00\x01a", MalformedPacket),  # DUP on QoS 0
    (b"\x32\x05\x00\x01a\x00\x00", MalformedPacket),  # packet id 0
    (b"\x30\x04\x00\x02\xc3\x28", MalformedPacket),  # invalid UTF-8 in the topic
    (b"\x30\x04\x00\x02a\x00", MalformedPacket),  # U+0000 in the topic
    (b"\x80\x03\x00\x01\x00", MalformedPacket),  # SUBSCRIBE with wrong fixed flags
    (b"\x82\x02\x00\x01", ProtocolViolation),  # SUBSCRIBE with no filter
    (b"\x82\x06\x00\x01\x00\x01a\x03", MalformedPacket),  # requested QoS 3
    (b"\x82\x06\x00\x01\x00\x01a\x04", MalformedPacket),  # 3.1.1 reserved option bit
    (b"\x60\x02\x00\x01", MalformedPacket),  # PUBREL with flags 0
    (b"\xc0\x01\x00", MalformedPacket),  # PINGREQ with a body
    (b"\x00\x00", MalformedPacket),  # reserved packet type 0
    (b"\xf0\x00", MalformedPacket),  # AUTH in 3.1.1
])
def test_specific_malformed_packets_v311(wire: bytes, error: type[Exception] | None) -> None:
    reader = PacketReader(version=MQTT_3_1_1)
    reader.feed(wire)
    if error is None:
        assert len(list(reader.packets())) == 1
    else:
        with pytest.raises(error):
            list(reader.packets())


@pytest.mark.parametrize("props_block, error", [
    (b"\x02\x01\x00", None),  # payload format indicator 0 (control case)
    (b"\x02\x01\x02", ProtocolViolation),  # payload format indicator 2
    (b"\x04\x01\x00\x01\x01", ProtocolViolation),  # the same property twice
    (b"\x03\x11\x00\x00", MalformedPacket),  # session expiry (CONNECT-only) in PUBLISH
    (b"\x03\x23\x00\x00", ProtocolViolation),  # topic alias 0
    (b"\x05\x01\x00", MalformedPacket),  # property length beyond the packet
    (b"\x02\x7f\x00", MalformedPacket),  # unknown property id
])
def test_publish_property_rules_v5(props_block: bytes, error: type[Exception] | None) -> None:
    body = b"\x00\x01a" + props_block
    reader = PacketReader(version=MQTT_5)
    reader.feed(fixed_header(0x30, len(body)) + body)
    if error is None:
        (packet,) = list(reader.packets())
        assert packet.properties.payload_format_indicator == 0
    else:
        with pytest.raises(error):
            list(reader.packets())


def test_connect_rules() -> None:
    def connect_frame(name: bytes, level: int, flags: int) -> bytes:
        body = len(name).to_bytes(2, "big") + name + bytes((level, flags)) + b"\x00\x3c" + b"\x00\x01c"
        return fixed_header(0x10, len(body)) + body

    for frame, error in [
        (connect_frame(b"MQTT", 4, 0x02), None),
        (connect_frame(b"MQTT", 6, 0x02), UnsupportedProtocolVersion),
        (connect_frame(b"MQTX", 4, 0x02), MalformedPacket),
        (connect_frame(b"MQTT", 4, 0x03), MalformedPacket),  # reserved flag
        (connect_frame(b"MQTT", 4, 0x12), MalformedPacket),  # will QoS without will flag
    ]:
        reader = PacketReader()
        reader.feed(frame)
        if error is None:
            (packet,) = list(reader.packets())
            assert packet == Connect("c", MQTT_3_1_1, True, 60) and reader.version == MQTT_3_1_1
        else:
            with pytest.raises(error):
                list(reader.packets())


def test_first_packet_must_be_connect() -> None:
    reader = PacketReader()
    reader.feed(encode(PingReq()))
    with pytest.raises(ProtocolViolation):
        list(reader.packets())


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
@given(data=st.data())
def test_a_publish_template_renders_what_encode_gives(version: int, data: st.DataObject) -> None:
    """The fan-out path encodes a PUBLISH once and patches the packet id (and DUP) per copy: each
    copy is byte for byte what ``encode`` gives for that packet, payloads large enough to need
    a longer remaining length included."""
    topic = data.draw(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00#+"),
                              min_size=1, max_size=40))
    payload = data.draw(st.one_of(st.binary(max_size=64), st.binary(min_size=120, max_size=20_000)))
    qos = data.draw(st.integers(0, 2))
    retain = data.draw(st.booleans())
    properties = data.draw(props("publish", version))
    template = PublishTemplate.of(topic, payload, qos, retain, version, properties)
    for _ in range(3):
        pid = data.draw(packet_id) if qos else None
        dup = data.draw(st.booleans()) if qos else False
        expected = encode(Publish(topic, payload, qos, retain, dup, pid, properties), version)
        assert template.render(pid, dup) == expected
