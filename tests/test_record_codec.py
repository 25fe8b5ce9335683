"""Property tests of the commitlog record codec: round trips, and bad bytes fail only one way."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from store.errors import RecordCorruptError
from store.log.record import RecordView, encode_properties, encode_record

text = st.text(max_size=40)
queue_names = st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=5)


@given(
    topic=text, key=text, props=st.dictionaries(text, text, max_size=5), queues=queue_names,
    body=st.binary(max_size=2000), born=st.integers(0, 2**62), store=st.integers(0, 2**62),
)
def test_record_round_trip(topic, key, props, queues, body, born, store):
    names = [q.encode() for q in queues]
    offsets = list(range(7, 7 + len(names)))
    raw = encode_record(
        topic=topic.encode(), key=key.encode(), properties=encode_properties(props),
        queues=names, offsets=offsets, body=body, born_ts=born, store_ts=store,
    )
    view = RecordView(b"junk" + raw + b"tail", 4)
    assert view.size == len(raw)
    assert (view.topic, view.key, view.body, view.born_ts, view.store_ts) == (topic, key, body, born, store)
    assert view.queues() == list(zip(queues, offsets))


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_record_corrupt(data):
    try:
        RecordView(data, 0)
    except RecordCorruptError:
        pass


@given(st.data())
def test_any_single_flipped_byte_is_detected(data):
    raw = bytearray(encode_record(
        topic=b"t/x", key=b"k", properties=b"", queues=[b"q"], offsets=[3],
        body=b"payload-bytes", born_ts=1, store_ts=2,
    ))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    try:
        view = RecordView(bytes(raw), 0)
    except RecordCorruptError:
        return
    raise AssertionError(f"flipped byte {i} went unnoticed: {view.body!r}")
