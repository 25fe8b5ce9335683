"""Differential tests of the compiled record codec (store/log/record.py): the C extension and the
interpreted reference (the same ``.py``) frame the same bytes for any message, and give the same
fields, or the same error type and message, for valid, damaged, truncated and random records,
read from bytes or from a map as recovery reads a segment."""

from __future__ import annotations

import mmap
import random
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .native_support import compiled, interpreted, outcome

RECORD = "store.log.record"
I64 = st.integers(-(2**63), 2**63 - 1)
U64 = st.integers(0, 2**64 - 1)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

texts = st.text(max_size=40)
# (hypothesis's own binary() stays within its small buffer: large bodies are drawn as a size and a seed)
large_bodies = st.builds(lambda size, seed: random.Random(seed).randbytes(size), st.integers(60_000, 300_000),
                         st.integers(0, 2**32))
bodies = st.one_of(st.binary(max_size=300), large_bodies)
properties = st.dictionaries(st.one_of(texts, st.just("TAGS")), texts, max_size=6)
queue_lists = st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=5)


def both() -> tuple[ModuleType, ModuleType]:
    return compiled(RECORD), interpreted(RECORD)


def encode(module: ModuleType, topic: str, key: str, props: dict[str, str], queues: list[str],
           offsets: list[int], body: bytes, born: int, store: int, flags: int) -> tuple[str, Any]:
    encoded = outcome(module.encode_properties, props)
    if encoded[0] == "error":
        return encoded
    return outcome(module.encode_record, topic=topic.encode(), key=key.encode(), properties=encoded[1],
                   queues=[q.encode() for q in queues], offsets=offsets, body=body, born_ts=born,
                   store_ts=store, flags=flags)


def view(module: ModuleType, buf: Any, pos: int, verify: bool = True) -> tuple[str, Any]:
    """Every field of the record at ``pos``, its queue list and properties, or the error."""
    try:
        v = module.RecordView(buf, pos, verify=verify)
    except Exception as exc:  # noqa: BLE001
        return "error", (type(exc), str(exc))
    fields = (v.size, v.flags, v.born_ts, v.store_ts, v.queue_count, v.topic, v.key, v.raw_properties,
              v.raw_queues, v.body)
    return "value", (fields, outcome(v.queues), outcome(module.decode_properties, v.raw_properties))


def assert_same_view(buf: bytes, pos: int) -> None:
    fast, reference = both()
    seen = view(fast, buf, pos)
    assert seen == view(reference, buf, pos)
    assert view(fast, buf, pos, verify=False) == view(reference, buf, pos, verify=False)
    if len(buf):  # as recovery reads a segment: from a map
        with mmap.mmap(-1, len(buf)) as mm:
            mm[:] = buf
            assert view(fast, mm, pos) == seen


@SETTINGS
@given(topic=texts, key=texts, props=properties, queues=queue_lists, body=bodies, born=I64, store=I64,
       flags=st.integers(0, 2**32 - 1), data=st.data())
def test_records_are_framed_and_read_back_the_same(topic: str, key: str, props: dict[str, str], queues: list[str],
                                                   body: bytes, born: int, store: int, flags: int,
                                                   data: st.DataObject) -> None:
    fast, reference = both()
    offsets = data.draw(st.lists(U64, min_size=len(queues), max_size=len(queues)))
    args = (topic, key, props, queues, offsets, body, born, store, flags)
    framed = encode(fast, *args)
    assert framed == encode(reference, *args)
    assert framed[0] == "value"
    raw = framed[1]
    junk = data.draw(st.binary(max_size=8))
    assert_same_view(junk + raw + data.draw(st.binary(max_size=8)), len(junk))
    fields = view(fast, junk + raw, len(junk))[1]
    assert fields[0][2:] == (born, store, len(queues), topic, key, fields[0][7], fields[0][8], body)
    assert fields[1] == ("value", list(zip(queues, offsets)))
    assert fields[2] == ("value", props)


@SETTINGS
@given(topic=texts, body=st.binary(max_size=200), data=st.data())
def test_damaged_and_truncated_records_fail_the_same_way(topic: str, body: bytes, data: st.DataObject) -> None:
    fast, _ = both()
    raw = bytearray(fast.encode_record(
        topic=topic.encode(), key=b"k", properties=fast.encode_properties({"TAGS": "t", "a": "b"}),
        queues=[b"q/1", b"q/2"], offsets=[3, 4], body=body, born_ts=1, store_ts=2))
    for _ in range(data.draw(st.integers(0, 4))):  # flip bytes (header fields included)
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(raw)))
    damaged = bytes(raw[:cut] if data.draw(st.booleans()) else raw)
    assert_same_view(damaged, data.draw(st.integers(0, len(damaged) + 2)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 40))
def test_random_bytes_fail_the_same_way(raw: bytes, pos: int) -> None:
    assert_same_view(raw, pos)


@SETTINGS
@given(block=st.binary(max_size=80), count=st.integers(0, 6))
def test_property_and_queue_blocks_decode_the_same(block: bytes, count: int) -> None:
    fast, reference = both()
    assert outcome(fast.decode_properties, block) == outcome(reference.decode_properties, block)
    assert outcome(fast.decode_queues, block, count) == outcome(reference.decode_queues, block, count)


def test_mutated_blocks_decode_the_same() -> None:
    """Valid property and queue blocks with bytes flipped and cut: the lengths inside lie."""
    fast, reference = both()
    rng = random.Random(21)
    props = fast.encode_properties({"TAGS": "t", "name": "välue", "": "x" * 300})
    queues = b"".join(len(q).to_bytes(2, "big") + q + o.to_bytes(8, "big") for q, o in ((b"a/q", 1), ("é".encode(), 2)))
    for _ in range(3000):
        for block, count in ((props, 0), (queues, 2)):
            raw = bytearray(block)
            for _ in range(rng.randint(0, 3)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            raw = bytes(raw[: rng.randint(0, len(raw))]) if rng.random() < 0.5 else bytes(raw)
            assert outcome(fast.decode_properties, raw) == outcome(reference.decode_properties, raw)
            assert outcome(fast.decode_queues, raw, count) == outcome(reference.decode_queues, raw, count)


@pytest.mark.parametrize("case", [
    {"topic": b"t" * 0x10000},
    {"key": b"k" * 0x10000},
    {"queues": [b"q"] * 0x10000, "offsets": [0] * 0x10000},
    {"born_ts": 2**63},
    {"store_ts": -(2**63) - 1},
    {"flags": 2**32},
    {"flags": -1},
    {"offsets": [-1]},
    {"offsets": [2**64]},
    {"offsets": [1, 2]},
    {"body": bytearray(b"from a bytearray"), "properties": memoryview(b"\x00\x01a\x00\x00\x00\x01b")},
    {"body": None},
    {"topic": "a str"},
    {"queues": [None]},
])
def test_bad_arguments_fail_the_same_way(case: dict[str, Any]) -> None:
    fast, reference = both()
    args = {"topic": b"t", "key": b"", "properties": b"", "queues": [b"q"], "offsets": [0], "body": b"x",
            "born_ts": 1, "store_ts": 2, "flags": 0} | case
    mine, theirs = outcome(fast.encode_record, **args), outcome(reference.encode_record, **args)
    if mine[0] == "error" and mine[1][0] is OverflowError:
        # C integer conversion words its message differently; the type is what a caller sees
        assert theirs[0] == "error" and theirs[1][0] is OverflowError
    else:
        assert mine == theirs


@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_assemble_refuses_a_size_that_does_not_match_its_fields(delta: int) -> None:
    """The compiled build fills a buffer of exactly ``size`` bytes: a wrong size must not write
    past it (or leave garbage in it)."""
    for module in both():
        static = module.encode_static(b"topic", b"", b"", 1, 3)
        slots = module.queue_slots([b"q"])
        size = module.record_size(static, slots, 3) + delta
        kind, (error, message) = outcome(module.assemble, size, static, slots, [0], b"abc", 1, 2)
        assert (kind, error) == ("error", ValueError) and "does not match" in message
        kind, (error, _) = outcome(module.assemble, size - delta, static, [None], [0], b"abc", 1, 2)
        assert (kind, error) == ("error", TypeError)


@given(queues=st.lists(st.text(max_size=20) | st.text(min_size=4090, max_size=4100, alphabet="ab\u00e9")
                       | st.text(alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=4),
                       min_size=1, max_size=3))
def test_queue_slots_are_built_and_refused_the_same(queues: list[str]) -> None:
    """queue_slots_of: the compiled build reads a name's UTF-8 where the string keeps it; names
    with lone surrogates, empty names and names over 4,096 bytes are refused alike."""
    fast, reference = both()
    assert outcome(fast.queue_slots_of, queues) == outcome(reference.queue_slots_of, queues)
