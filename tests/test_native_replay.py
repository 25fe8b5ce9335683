"""Differential tests of the compiled replay (store/log/replay.py: a follower's and recovery's
reading and indexing of commitlog records): the C extension and the interpreted reference (the
same ``.py``) read the same records out of a real store's commitlog, cut anywhere, and make the
same index items, meta and drop calls from them -- ordinary messages with keys, tags and several
queues, held (timer) messages and their release."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Message, MessageStore, StoreOptions
from store.holds.codec import TIMER
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


def replayed(module: ModuleType, store: MessageStore, start: int, end: int) -> list[Any]:
    recorder = Recorder()
    replay = module.Replay(store.index, recorder, recorder.meta)
    last = replay.add_records(store.commitlog, start, end)
    replay.flush(last)
    recorder.calls.append(("end", last))
    return recorder.calls


async def a_store(path: Path) -> MessageStore:
    store = await MessageStore.open(StoreOptions(data_dir=path, segment_size=64 << 10))
    for i in range(120):
        # (a value holding the bytes that name TAGS in a properties block, without a TAGS property)
        props = {"TAGS": f"tag{i % 3}", "p": "v" * (i % 5)} if i % 2 else {"x": "\x00\x04TAGS"} if i % 7 else None
        await store.put(Message(f"topic/{i % 4}", b"b" * (i % 300), props, key=f"k{i}" if i % 3 else None),
                        [f"q{i % 5}", f"r{i % 2}"] if i % 4 else [f"q{i % 5}"])
    held = await store.held.put(Message("t", b"later", {"a": "1"}, key="k1", tags="tagA"), ["q", "q2"], TIMER,
                                1 << 50)
    await store.held.release(store.held.due(TIMER, 1 << 51, 10))
    store.commitlog.append([_meta_record()])
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
async def test_a_log_cut_anywhere_replays_alike(tmp_path: Path, cut: int) -> None:
    path = tmp_path / f"s{cut}"
    store = await a_store(path)
    try:
        end = cut % (store.commitlog.end_position + 1)  # (a record cut short at the end is not read)
        assert replayed(C, store, 0, end) == replayed(PY, store, 0, end)
    finally:
        await store.close()
