"""The hand-built delivery frames are byte for byte what pamqp writes (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pamqp import body, commands, frame, header

from protocols.amqp.frames import (
    content_after_method,
    decode_properties,
    deliver_frame,
    delivery,
    encode_properties,
    shortstr,
)

short = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
exchange_name = st.text(alphabet="abcXYZ019-_.:", max_size=40)  # what pamqp accepts
properties = st.builds(
    commands.Basic.Properties,
    content_type=st.one_of(st.none(), short), delivery_mode=st.one_of(st.none(), st.sampled_from([1, 2])),
    priority=st.one_of(st.none(), st.integers(0, 9)), expiration=st.one_of(st.none(), st.integers(0, 10**6).map(str)),
    message_id=st.one_of(st.none(), short), headers=st.one_of(st.none(), st.dictionaries(short, st.integers(0, 10**6) | short)),
)


@given(st.integers(0, 65535), short, st.integers(0, 2**63 - 1), st.booleans(), exchange_name, short)
def test_deliver_frame_matches_pamqp(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key):
    method = commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    assert deliver_frame(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key) == \
        frame.marshal(method, channel)


@given(st.integers(0, 65535), properties, st.binary(max_size=9000), st.sampled_from([4096, 131072]))
def test_content_frames_match_pamqp(channel, props, payload, frame_max):
    step = frame_max - 8
    expected = frame.marshal(header.ContentHeader(0, len(payload), props), channel) + b"".join(
        frame.marshal(body.ContentBody(payload[i:i + step]), channel) for i in range(0, len(payload), step))
    assert content_after_method(channel, encode_properties(props), payload, frame_max) == expected
    pamqp_round_trip = header.ContentHeader()
    pamqp_round_trip.unmarshal(header.ContentHeader(0, 0, props).marshal())
    assert decode_properties(encode_properties(props)) == pamqp_round_trip.properties


@given(st.integers(0, 65535), short, st.integers(0, 2**63 - 1), st.booleans(), exchange_name, short, properties,
       st.binary(max_size=9000), st.sampled_from([4096, 131072]))
def test_whole_delivery_is_deliver_and_content_frames(channel, consumer_tag, delivery_tag, redelivered, exchange,
                                                      routing_key, props, payload, frame_max):
    raw = encode_properties(props)
    expected = deliver_frame(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key) + \
        content_after_method(channel, raw, payload, frame_max)
    assert delivery(channel, shortstr(consumer_tag), delivery_tag, redelivered,
                    shortstr(exchange) + shortstr(routing_key), raw, payload, frame_max) == expected
