"""Differential tests of the bulk readers' record decoder (store/log/record_columns.py): the C
extension, the interpreted reference (the same ``.py``) and the one-record decoder
(``store.log.record.RecordView``, the layout's other reader) give the same fields for any records;
for damaged, truncated or misplaced records both builds give the same ``RecordCorruptError``
(never a read past the buffer, never a crash)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.errors import RecordCorruptError
from store.log.record import RecordView, encode_properties, encode_record

from .native_support import compiled, damage, interpreted, outcome

MODULE = "store.log.record_columns"
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALL = 1 | 2 | 4 | 8 | 16

texts = st.text(max_size=20)
messages = st.tuples(
    st.sampled_from(["devices/1/t", "devices/22/t", "a", ""]) | texts,  # topic: mostly shared
    texts,  # key ("" is none)
    st.dictionaries(texts, texts, max_size=3),
    st.binary(max_size=100),
    st.integers(-(2**63), 2**63 - 1),  # born
)


def records(items: list[tuple], gaps: list[int]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The records of ``items`` in one buffer, ``gaps[i]`` bytes of filler before each (other
    queues' records), and their positions and sizes."""
    out, rel, sizes = bytearray(), [], []
    for (topic, key, props, body, born), gap in zip(items, gaps):
        out += b"\xab" * gap
        record = encode_record(topic=topic.encode(), key=key.encode(), properties=encode_properties(props),
                               queues=[b"t:x"], offsets=[len(rel)], body=body, born_ts=born, store_ts=1)
        rel.append(len(out))
        sizes.append(len(record))
        out += record
    return bytes(out), np.array(rel, np.int64), np.array(sizes, np.int64)


def cut(module: ModuleType, buf: bytes, rel: np.ndarray, sizes: np.ndarray, fields: int,
        topic: str | None) -> tuple[str, Any]:
    """``cut``'s outcome with its columns as Python values (comparable with ==)."""
    got = outcome(module.cut, memoryview(buf), rel, sizes, fields, None if topic is None else topic.encode(),
                  "t:x", 100)
    if got[0] == "error":
        return got
    columns = []
    for column in got[1][:4]:
        if column is None:
            columns.append(None)
            continue
        offsets, data, valid = column
        values = [bytes(data[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]
        columns.append([v if valid is None or valid[i] else None for i, v in enumerate(values)])
    born = got[1][4]
    return "value", (*columns, None if born is None else born.tolist())


def reference(buf: bytes, rel: np.ndarray, fields: int, topic: str | None) -> tuple[str, Any]:
    """What ``cut`` must give, from the one-record decoder."""
    views = [RecordView(buf, int(p), verify=False) for p in rel]
    topics = [v.topic.encode() for v in views]
    same = topic is not None and all(t == topic.encode() for t in topics)
    return "value", (
        topics if fields & 1 and not same else None,
        [v.key.encode() or None for v in views] if fields & 2 else None,
        [v.raw_properties for v in views] if fields & 4 else None,
        [v.body for v in views] if fields & 8 else None,
        [v.born_ts for v in views] if fields & 16 else None,
    )


@SETTINGS
@given(items=st.lists(messages, max_size=8), gaps=st.lists(st.integers(0, 30), min_size=8, max_size=8),
       fields=st.integers(0, ALL), topic=st.none() | st.sampled_from(["devices/1/t", "a", ""]))
def test_both_builds_cut_what_the_record_decoder_reads(items: list, gaps: list[int], fields: int,
                                                       topic: str | None) -> None:
    buf, rel, sizes = records(items, gaps)
    expected = reference(buf, rel, fields, topic)
    assert cut(compiled(MODULE), buf, rel, sizes, fields, topic) == expected
    assert cut(interpreted(MODULE), buf, rel, sizes, fields, topic) == expected


@SETTINGS
@given(items=st.lists(messages, min_size=1, max_size=5), gaps=st.lists(st.integers(0, 10), min_size=5, max_size=5),
       data=st.data())
def test_damaged_records_give_the_same_answer_or_error_in_both_builds(items: list, gaps: list[int], data) -> None:
    buf, rel, sizes = records(items, gaps)
    broken = damage(data, buf)
    if data.draw(st.booleans()):  # a wrong size in the index, or a position past the bytes
        i = data.draw(st.integers(0, len(rel) - 1))
        sizes[i] += data.draw(st.integers(-50, 50))
        rel[i] += data.draw(st.sampled_from([0, 1, -1, len(broken)]))
    fields = data.draw(st.integers(0, ALL))
    mine = cut(compiled(MODULE), broken, rel, sizes, fields, "devices/1/t")
    theirs = cut(interpreted(MODULE), broken, rel, sizes, fields, "devices/1/t")
    assert mine == theirs
    if mine[0] == "error":
        assert mine[1][0] is RecordCorruptError


@pytest.mark.parametrize("build", [compiled, interpreted])
def test_bad_records_are_errors_naming_queue_and_offset(build) -> None:
    module = build(MODULE)
    buf, rel, sizes = records([("a", "", {}, b"body", 5)] * 3, [0, 7, 0])
    fine = module.cut(memoryview(buf), rel, sizes, ALL, None, "t:x", 100)
    assert [bytes(fine[3][1])] == [b"body" * 3]
    with pytest.raises(RecordCorruptError, match=r"queue t:x offset 102: its record .* is not within"):
        module.cut(memoryview(buf[:-1]), rel, sizes, ALL, None, "t:x", 100)  # truncated
    moved = rel.copy()
    moved[1] += 1
    with pytest.raises(RecordCorruptError, match=r"queue t:x offset 101: no valid record .*magic"):
        module.cut(memoryview(buf), moved, sizes, ALL, None, "t:x", 100)
    longer = sizes.copy()
    longer[0] += 1
    with pytest.raises(RecordCorruptError, match=r"offset 100: no valid record .*index says"):
        module.cut(memoryview(buf), rel, longer, ALL, None, "t:x", 100)
    lying = bytearray(buf)
    lying[rel[2] + 42:rel[2] + 46] = (10_000).to_bytes(4, "big")  # body_len past the record
    with pytest.raises(RecordCorruptError, match=r"offset 102: field lengths exceed"):
        module.cut(memoryview(bytes(lying)), rel, sizes, ALL, None, "t:x", 100)
    with pytest.raises(ValueError, match="3 positions but 2 sizes"):
        module.cut(memoryview(buf), rel, sizes[:2], ALL, None, "t:x", 100)
