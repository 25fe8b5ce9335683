"""Differential tests of the compiled AMQP frame reader (protocols/amqp/reader.py): the C
extension, the interpreted reference (the same ``.py``) and the reader as it was before the fast
path (tests/amqp_reference_reader.py: pamqp decodes every frame) give the same events and the
same protocol errors (reply code, text, channel) on hypothesis-generated streams of publishes
with random properties, other methods and heartbeats, damaged or cut anywhere, in any chunks."""

from __future__ import annotations

import random
import re
import struct
from datetime import UTC, datetime
from decimal import Decimal
from types import ModuleType
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from protocols.amqp.frames import (
    PROTOCOL_HEADER,
    AMQPError,
    ContentReceived,
    HeartbeatReceived,
    MethodReceived,
    ProtocolHeaderReceived,
    decode_properties,
)

from .amqp_reference_reader import OldContentReceived, ReferenceFrameReader
from .native_support import compiled, damage, interpreted, split

READER = "protocols.amqp.reader"
ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # pamqp's errors may name an object by its address

short = st.text(max_size=12).filter(lambda s: len(s.encode()) <= 255)
table_key = st.text(max_size=6).filter(lambda s: len(s.encode()) <= 128)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), st.floats(allow_nan=False, width=32),
    st.text(max_size=12), st.binary(max_size=8).map(bytearray),
    st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-10**6, max_value=10**6),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1)).map(
        lambda d: d.replace(microsecond=0, tzinfo=UTC)),
)
field_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(table_key, inner,
                                                                                                   max_size=3),
                            max_leaves=6)
optional = st.none().__or__
properties = st.builds(
    commands.Basic.Properties,
    content_type=optional(short), content_encoding=optional(short),
    headers=optional(st.dictionaries(table_key, field_values, max_size=4)),
    delivery_mode=optional(st.sampled_from([1, 2])), priority=optional(st.integers(0, 255)),
    correlation_id=optional(short), reply_to=optional(short), expiration=optional(short),
    message_id=optional(short), timestamp=optional(st.datetimes(min_value=datetime(1970, 1, 2)).map(
        lambda d: d.replace(microsecond=0, tzinfo=UTC))),
    message_type=optional(short), user_id=optional(short), app_id=optional(short),
)
channels = st.integers(0, 3)


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def shortstr(raw: bytes) -> bytes:
    return bytes((len(raw),)) + raw


@st.composite
def publishes(draw: st.DrawFn, valid: bool = False) -> bytes:
    """basic.publish (built by hand: any ticket, names and bits), its header and body frames;
    ``valid``: on an open channel, UTF-8 names, as many body bytes as the header says."""
    channel = draw(st.integers(1, 3) if valid else channels)
    names = short.map(str.encode) if valid else st.one_of(short.map(str.encode), st.binary(max_size=6))
    method = struct.pack(">HHH", 60, 40, draw(st.sampled_from([0, 0, 0, 7]))) + shortstr(draw(names)) + \
        shortstr(draw(names)) + bytes((draw(st.sampled_from([0, 1, 2, 3, 0x80])),))
    props = draw(properties)
    try:
        header = pheader.ContentHeader(0, 0, props).marshal()[12:]
    except (TypeError, ValueError, OverflowError, struct.error):  # values pamqp cannot encode
        assume(False)
    body = draw(st.binary(max_size=40))
    size = len(body) if valid else draw(st.one_of(st.just(len(body)), st.integers(0, 50)))
    wire = frame(1, channel, method) + frame(2, channel, struct.pack(">HHQ", 60, 0, size) + header)
    step = draw(st.integers(1, 48))
    return wire + b"".join(frame(3, channel, body[i:i + step]) for i in range(0, len(body), step))


others = st.one_of(
    st.builds(lambda c, t, m: pframe.marshal(commands.Basic.Ack(t, m), c), channels, st.integers(0, 2 ** 63 - 1),
              st.booleans()),
    # basic.ack built by hand: any tag (top bit set too), any bits, a payload cut short or too long
    st.builds(lambda c, t, bits, cut: frame(1, c, (struct.pack(">HHQ", 60, 80, t) + bytes((bits,)) + b"\0\0")[:cut]),
              channels, st.integers(0, 2 ** 64 - 1), st.integers(0, 255), st.sampled_from([12, 13, 13, 14, 15])),
    st.builds(lambda c: pframe.marshal(commands.Channel.Open(), c), channels),
    st.builds(lambda c, q: pframe.marshal(commands.Queue.Declare(queue=q), c), channels,
              st.text(alphabet="abc.-_", max_size=10)),
    st.builds(lambda c, b: pframe.marshal(ContentBody(b), c), channels, st.binary(min_size=1, max_size=10)),
    channels.map(lambda c: frame(8, c, b"")),
)
streams = st.lists(st.one_of(publishes(), others), max_size=5).map(b"".join)


def normal(value: Any) -> Any:
    """An event or error as plain data (pamqp's objects compare by identity)."""
    if isinstance(value, AMQPError):
        return ("error", value.reply_code, ADDRESS.sub(" at 0x", value.text), value.channel, value.connection,
                normal(value.method) if value.method is not None else None)
    if isinstance(value, ProtocolHeaderReceived):
        return ("header", value.ok)
    if isinstance(value, HeartbeatReceived):
        return ("heartbeat",)
    if isinstance(value, MethodReceived):
        return ("method", value.channel, normal(value.method))
    if isinstance(value, (ContentReceived, OldContentReceived)):
        # repr: a float header value may be NaN, which equals nothing
        return ("content", value.channel, normal(value.method), repr(list(value.properties)), value.body)
    if isinstance(value, commands.Basic.Properties):
        return repr(list(value))
    return (value.name, repr([(k, getattr(value, k)) for k in value.__slots__]))


def read(reader: Any, chunks: list[bytes]) -> list[Any]:
    """Feed ``chunks``; every event, and each error with what the connection does after it
    (gateway/amqp/connection.py: a channel error closes the channel, a connection error leaves
    only close-ok to read), then the state."""
    seen: list[Any] = []
    for chunk in [PROTOCOL_HEADER, *chunks]:
        reader.feed(chunk)
        for _ in range(100):  # bounded: each round ends in an error or at the end of the bytes
            try:
                seen.extend(normal(e) for e in reader.events())
                break
            except AMQPError as exc:
                seen.append(normal(exc))
                if exc.connection:
                    reader.methods_only()
                else:
                    reader.forget_channel(exc.channel)
    seen.append(("state", reader.buffered, reader.failed))
    return seen


def readers(module: ModuleType, frame_max: int, max_body: int) -> Any:
    return module.FrameReader(frame_max=frame_max, max_body=max_body)


def assert_same_reading(chunks: list[bytes], frame_max: int = 4096, max_body: int = 1 << 20) -> list[Any]:
    fast = read(readers(compiled(READER), frame_max, max_body), chunks)
    assert fast == read(readers(interpreted(READER), frame_max, max_body), chunks)
    assert fast == read(ReferenceFrameReader(frame_max=frame_max, max_body=max_body), chunks)
    return fast


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(wire=streams, cuts=st.lists(st.integers(0, 1 << 12), max_size=4), max_body=st.sampled_from([20, 1 << 20]))
def test_streams_read_the_same_in_any_chunks(wire: bytes, cuts: list[int], max_body: int) -> None:
    assert_same_reading(split(wire, cuts), max_body=max_body)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_damaged_streams_read_the_same(data: st.DataObject) -> None:
    """Bytes changed, inserted, removed or cut anywhere, in the frame headers and payloads."""
    wire = damage(data, data.draw(streams))
    wire = wire[:data.draw(st.integers(0, len(wire)))]
    assert_same_reading(split(wire, data.draw(st.lists(st.integers(0, 1 << 12), max_size=3))))


@settings(max_examples=600)
@given(channel=st.integers(1, 3), flags=st.integers(0, 0xFFFF), blob=st.binary(max_size=60))
def test_random_property_lists_read_the_same(channel: int, flags: int, blob: bytes) -> None:
    """A content header whose flags and property list are any bytes."""
    wire = (pframe.marshal(commands.Basic.Publish(routing_key="q"), channel)
            + frame(2, channel, struct.pack(">HHQH", 60, 0, 0, flags) + blob))
    assert_same_reading([wire])


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(wire=publishes(valid=True))
def test_the_fast_path_decodes_as_pamqp(wire: bytes) -> None:
    """A valid publish's method, body and properties as pamqp decodes them, and its raw
    properties the exact bytes of the content header (nothing encoded again)."""
    for module in (compiled(READER), interpreted(READER)):
        reader = module.FrameReader(frame_max=4096, max_body=1 << 20)
        reader.feed(PROTOCOL_HEADER + wire)
        (event,) = list(reader.events())[1:]
        assert event._properties is None, "the fast path left a valid content header to pamqp"
        hypothesis_event("read by the fast path")
        _, method_size = struct.unpack_from(">HI", wire, 1)
        _, _, method = pframe.unmarshal(wire[:method_size + 8])
        header_at = method_size + 8
        _, _, header = pframe.unmarshal(wire[header_at:])
        assert normal(event.method) == normal(method)
        assert event.properties == header.properties and event.properties is not header.properties
        assert event.delivery_mode == header.properties.delivery_mode
        assert event.message_id == header.properties.message_id
        header_size = struct.unpack_from(">I", wire, header_at + 3)[0]
        assert event.raw_properties == wire[header_at + 7 + 12:header_at + 7 + header_size]
        assert decode_properties(event.raw_properties) == header.properties
        assert event.headers == header.properties.headers


def test_a_seeded_mutation_run_of_the_publish_frames_reads_the_same() -> None:
    """Every byte of a publish, its content header (with a headers table, a timestamp and a
    message id) and its body frame set to interesting values (a bounded, seeded loop)."""
    rng = random.Random(21)
    props = commands.Basic.Properties(
        content_type="text/plain", headers={"a": 1, "b": [True, "x", {"c": Decimal("1.5")}], "t": datetime(
            2026, 1, 1, tzinfo=UTC)}, delivery_mode=2, message_id="m-1",
        timestamp=datetime(2026, 1, 1, tzinfo=UTC))
    wire = (pframe.marshal(commands.Basic.Publish(exchange="x", routing_key="rk", mandatory=True), 1)
            + pframe.marshal(pheader.ContentHeader(0, 5, props), 1) + pframe.marshal(ContentBody(b"hello"), 1))
    for at in range(len(wire)):
        for value in (0x00, 0x01, 0x7F, 0x80, 0xCE, 0xFF, rng.randrange(256)):
            damaged = wire[:at] + bytes([value]) + wire[at + 1:]
            assert_same_reading([damaged])
            assert_same_reading([damaged[:rng.randrange(len(damaged) + 1)]])
