"""Differential tests of the compiled store-link codec (gateway/cluster/store_link.py): the C
extension and the interpreted reference (the same ``.py``) encode the same bytes and decode the
same values -- or refuse with the same error -- for hypothesis-drawn PUT bodies, PUT results,
offsets, queue names and KV items, whole and damaged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from store import Message, PutResult

from .native_support import compiled, damage, interpreted

MODULE = "gateway.cluster.store_link"
C, PY = compiled(MODULE), interpreted(MODULE)

text = st.text(max_size=12)
queue_lists = st.lists(text, max_size=3)
messages = st.builds(
    Message, text, st.binary(max_size=40), key=st.none() | text, tags=st.none() | text,
    born_timestamp=st.none() | st.integers(0, 2 ** 62), encoded_properties=st.binary(max_size=20),
    flag=st.integers(0, 2 ** 32 - 1), hold_kind=st.integers(0, 3), hold_due_ms=st.integers(0, 2 ** 63 - 1))
put_items = st.lists(st.tuples(messages, queue_lists), max_size=4)
results = st.lists(st.builds(PutResult, st.just("P"), st.integers(0, 2 ** 63), st.integers(0, 2 ** 32 - 1),
                             st.integers(-(2 ** 63), 2 ** 63 - 1),
                             st.dictionaries(text, st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=3)), max_size=4)


def plain(value: Any) -> Any:
    """What a decoded value holds, comparable across the two builds."""
    if isinstance(value, Message):
        return ("message", value.topic, value.body, value.key, value.tags, value.born_timestamp,
                value.encoded_properties, value.flag, value.hold_kind, value.hold_due_ms)
    if isinstance(value, PutResult):
        return ("result", value.msg_id, value.position, value.size, value.store_timestamp, dict(value.queue_offsets))
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", plain(call()))
    except Exception as exc:  # (each build has its own StoreLinkError class: compared by name)
        return ("error", type(exc).__name__, str(exc))


def same(name: str, *args: Any) -> tuple[Any, ...]:
    mine, reference = outcome(lambda: getattr(C, name)(*args)), outcome(lambda: getattr(PY, name)(*args))
    assert mine == reference
    return mine


@given(put_items, st.data())
def test_put_bodies_encode_and_decode_alike(items, data) -> None:
    body = same("encode_put", items)
    assert body[0] == "ok"
    same("decode_put", body[1])
    same("decode_put", damage(data, body[1]))


@given(results, st.booleans(), st.data())
def test_put_results_encode_and_decode_alike(put_results, with_offsets: bool, data) -> None:
    body = same("encode_put_results", put_results, with_offsets)
    assert body[0] == "ok"
    decoded = same("decode_put_results", body[1], "P")
    assert decoded[1] == [("result", r.msg_id, r.position, r.size, r.store_timestamp,
                           dict(r.queue_offsets) if with_offsets else {}) for r in put_results]
    same("decode_put_results", damage(data, body[1]), "P")


@given(st.dictionaries(text, st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=4), st.lists(text, max_size=4),
       st.lists(st.tuples(text, st.binary(max_size=16)), max_size=4), st.data())
def test_offsets_names_and_items_encode_and_decode_alike(offsets, names, items, data) -> None:
    for encode, decode, value in (("encode_offsets", "decode_offsets", offsets), ("encode_names", "decode_names", names),
                                  ("encode_items", "decode_items", items)):
        body = same(encode, value)
        assert body[0] == "ok"
        same(decode, body[1])
        same(decode, damage(data, body[1]))


@given(st.binary(max_size=120))
def test_random_bytes_decode_alike(blob: bytes) -> None:
    for name, args in (("decode_put", ()), ("decode_put_results", ("P",)), ("decode_offsets", ()),
                       ("decode_names", ()), ("decode_items", ()), ("decode_messages", ("P", "q"))):
        same(name, blob, *args)


async def test_a_puts_own_results_are_answered_as_the_results_they_make(tmp_path) -> None:
    """A store node answers a gateway node's put from its ``PutResults`` without making each
    result: the answer decodes to what the results say, held messages and a queue named twice
    included, in both builds."""
    from store import MessageStore, StoreOptions, TIMER

    store = await MessageStore.open(StoreOptions(data_dir=tmp_path / "s"))
    try:
        items = [(Message(f"t/{i}", b"x" * i, key="k" if i % 2 else None, tags="a" if i % 3 else None),
                  [f"q{i % 2}", "w", "w"][: 1 + i % 3]) for i in range(8)]
        results = await store.put_batch(items)
        held = await store.held.put(Message("t/h", b"later"), ["q0"], TIMER, 1 << 50)
        assert held is not None and hasattr(results, "places")  # (a put's own results)
        for put in (results, [held]):
            for with_offsets in (True, False):
                body = same("encode_put_results", put, with_offsets)
                assert body[0] == "ok"
                assert same("decode_put_results", body[1], put[0].msg_id[:-16])[1] == [
                    ("result", r.msg_id, r.position, r.size, r.store_timestamp,
                     dict(r.queue_offsets) if with_offsets else {}) for r in put]
    finally:
        await store.close()
