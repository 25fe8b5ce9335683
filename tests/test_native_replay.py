"""Differential tests of the compiled replay (store/log/replay.py: a follower's and recovery's
reading and indexing of commitlog records): the C extension and the interpreted reference (the
same ``.py``) read the same records out of a real store's commitlog, cut anywhere, and make the
same index items, meta and drop calls from them -- ordinary messages with keys, tags and several
queues, held (timer) messages and their release."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Message, MessageStore, StoreError, StoreOptions
from store.holds.codec import TIMER
from store.log.record import encode_record
from store.meta.journal import MetaBatch
from store.messages import tag_hash

from .native_support import compiled, interpreted

MODULE = "store.log.replay"
C, PY = compiled(MODULE), interpreted(MODULE)


class Recorder:
    """A dispatcher and meta callback that write down what they are asked."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def dispatch(self, items: list[Any], end: int, heads: dict[str, int] | None = None) -> None:
        # the heads Replay passes are each queue's pack_state after the items (the dispatcher's own
        # computation, when none are passed)
        implied = {name: (offset + 1) << 32 | qid for *_, targets, _, _ in items for name, qid, offset in targets}
        assert heads == implied
        self.calls.append(("dispatch", [list(item) for item in items], end, heads))

    def drop(self, names: list[str], end: int) -> None:
        self.calls.append(("drop", list(names), end))

    def meta(self, records: list[tuple[bytes, int]]) -> None:
        self.calls.append(("meta", list(records)))


def replayed(module: ModuleType, store: MessageStore, start: int, end: int, log: Any = None) -> list[Any]:
    recorder = Recorder()
    replay = module.Replay(store.index, recorder, recorder.meta)
    last = replay.add_records(log or store.commitlog, start, end)
    replay.flush(last)
    recorder.calls.append(("end", last))
    return recorder.calls


def viewed(module: ModuleType, store: MessageStore, start: int, end: int) -> list[Any]:
    """``replayed`` through a RecordView of every record (``add_records`` reads most from
    their bytes)."""
    recorder = Recorder()
    replay = module.Replay(store.index, recorder, recorder.meta)
    last = start
    for position, view in module.records(store.commitlog, start, end):
        replay.add(position, view)
        last = position + view.size
    replay.flush(last)
    recorder.calls.append(("end", last))
    return recorder.calls


async def a_store(path: Path) -> MessageStore:
    store = await MessageStore.open(StoreOptions(data_dir=path, segment_size=16 << 10))  # (rolls: several segments)
    for i in range(120):
        # (a value holding the bytes that name TAGS in a properties block, without a TAGS property)
        props = {"TAGS": f"tag{i % 3}", "p": "v" * (i % 5)} if i % 2 else {"x": "\x00\x04TAGS"} if i % 7 else None
        await store.put(Message(f"topic/{i % 4}", b"b" * (i % 300), props, key=f"k{i}" if i % 3 else None),
                        [f"q{i % 5}", f"r{i % 2}"] if i % 4 else [f"q{i % 5}"])
    held = await store.held.put(Message("t", b"later", {"a": "1"}, key="k1", tags="tagA"), ["q", "q2"], TIMER,
                                1 << 50)
    await store.held.release(store.held.due(TIMER, 1 << 51, 10))
    store.commitlog.append([_meta_record()])
    for i in range(60):  # (no key, no TAGS: read from their bytes)
        await store.put(Message(f"plain/{i % 3}", b"p" * (i % 200), {"p": "v" * (i % 4)} if i % 2 else None),
                        [f"q{i % 5}", f"plain{i % 3}", "w:plain/+"][: 1 + i % 3])
    assert held is not None
    return store


def _meta_record() -> bytes:
    from store.log.record import encode_record
    from store.holds.codec import HOLD_TOPIC
    body = MetaBatch().put(b"key", b"value").encode()
    return encode_record(topic=HOLD_TOPIC.encode(), key=b"", properties=b"", queues=[], offsets=[], body=body,
                         born_ts=1, store_ts=1)


async def test_a_whole_log_replays_alike(tmp_path: Path) -> None:
    store = await a_store(tmp_path / "s")
    try:
        end = store.commitlog.end_position
        mine, reference = replayed(C, store, 0, end), replayed(PY, store, 0, end)
        assert mine == reference
        kinds = {call[0] for call in mine}
        assert kinds == {"dispatch", "meta", "end"}
        tagged = {item[2] for call in mine if call[0] == "dispatch" for item in call[1]}
        assert {tag_hash("tag0"), tag_hash("tag1"), tag_hash("tag2"), 0} <= tagged
        assert sum(len(call[1]) for call in mine if call[0] == "dispatch") >= 121
    finally:
        await store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 1 << 20))
async def test_records_read_from_their_bytes_are_indexed_as_through_their_views(tmp_path: Path, cut: int) -> None:
    path = tmp_path / f"v{cut}"
    store = await a_store(path)
    try:
        end = cut % (store.commitlog.end_position + 1)
        for module in (C, PY):
            assert replayed(module, store, 0, end) == viewed(module, store, 0, end)
    finally:
        await store.close()


async def test_a_replay_ending_where_a_segment_rolled_stops_at_the_last_record(tmp_path: Path) -> None:
    """An end in the unused rest of a segment (or at its used end) is where the last whole
    record ends, not the next segment's start."""
    store = await a_store(tmp_path / "s")
    try:
        first, second = list(store.commitlog.segments())[:2]
        used_end = first.start + first.length
        assert used_end < second.start  # (the log rolled before the segment was full)
        for end in (used_end, used_end + 1, second.start - 1, second.start, second.start + 1):
            for module in (C, PY):
                calls = replayed(module, store, 0, end)
                assert calls == viewed(module, store, 0, end)
                assert calls[-1] == ("end", used_end)
    finally:
        await store.close()


def outcome(call: Any) -> Any:
    try:
        return call()
    except StoreError as exc:
        return ("refused", str(exc))


@pytest.mark.parametrize("topic, queues", [
    (b"\xff\xfet", [b"qa"]),  # a topic that is not UTF-8 (sound CRC)
    (b"t", [b"qa", b"\xff"]),  # a second queue name that is not UTF-8
    ("t/\u00e9".encode(), ["q\u00e9".encode(), b"qa"]),  # UTF-8 beyond ASCII: indexed
])
async def test_a_record_of_names_a_view_refuses_is_refused_alike_and_makes_no_queue(
        tmp_path: Path, topic: bytes, queues: list[bytes]) -> None:
    store = await MessageStore.open(StoreOptions(data_dir=tmp_path / "s"))
    try:
        store.commitlog.append([encode_record(topic=topic, key=b"", properties=b"", queues=queues,
                                              offsets=list(range(len(queues))), body=b"x", born_ts=1, store_ts=2)])
        end = store.commitlog.end_position
        for module in (C, PY):
            before = list(store.index.created)
            walked = outcome(lambda: replayed(module, store, 0, end))
            made = list(store.index.created)
            assert walked == outcome(lambda: viewed(module, store, 0, end))
            if walked[0] == "refused":
                assert made == before
    finally:
        await store.close()


class Damaged:
    """A commitlog whose reads have one byte flipped at ``at``."""

    def __init__(self, log: Any, at: int) -> None:
        self._log, self._at = log, at
        self.segment_size = log.segment_size

    def segment_of(self, position: int) -> Any:
        return self._log.segment_of(position)

    def read(self, position: int, size: int) -> bytes:
        data = bytearray(self._log.read(position, size))
        if position <= self._at < position + len(data):
            data[self._at - position] ^= 0x20
        return bytes(data)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 1 << 20))
async def test_a_damaged_record_is_refused_alike(tmp_path: Path, at: int) -> None:
    path = tmp_path / f"d{at}"
    store = await a_store(path)
    try:
        end = store.commitlog.end_position
        outcomes = []
        for module in (C, PY):
            try:
                outcomes.append(replayed(module, store, 0, end, Damaged(store.commitlog, at % end)))
            except StoreError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
    finally:
        await store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 1 << 20))
async def test_a_log_cut_anywhere_replays_alike(tmp_path: Path, cut: int) -> None:
    path = tmp_path / f"s{cut}"
    store = await a_store(path)
    try:
        end = cut % (store.commitlog.end_position + 1)  # (a record cut short at the end is not read)
        assert replayed(C, store, 0, end) == replayed(PY, store, 0, end)
    finally:
        await store.close()
