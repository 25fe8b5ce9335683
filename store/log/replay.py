# cython: annotation_typing=False
"""Records read back from the commitlog and indexed as the committer indexed them when it wrote
them: by recovery (recovery.py) and by a replica's follower for the bytes its leader sends
(store/replica/). On a follower this is the message path: compiled (setup.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import cython

from ..errors import RecordCorruptError, StoreError
from ..holds.codec import (DROP, HOLD, HOLD_TOPIC, INDIRECT, META, RELEASE, ControlRecord, hold_key, hold_value,
                           hold_writes, nested_offset, parse_drop)
from ..index.consumequeue import QID_MASK, ConsumeQueueIndex
from ..index.dispatcher import Dispatcher, DispatchItem
from ..index.keyindex import key_prefixes
from ..messages import TAGS_PROPERTY, tag_hash
from .commitlog import CommitLog
from .record import HEADER_SIZE, RecordView, decode_properties

REDISPATCH_BATCH = 8192
DROP_OP = bytes((DROP,))
META_OP = bytes((META,))
_TAGS_NAME = len(TAGS_PROPERTY).to_bytes(2, "big") + TAGS_PROPERTY.encode()  # as a properties block names it


class Replay:
    """Records read back from the commitlog, indexed as the committer indexed them when it wrote
    them: by recovery, and by a follower for the bytes its leader sends (store/replica/)."""

    def __init__(self, index: ConsumeQueueIndex, dispatcher: Dispatcher,
                 on_meta: Callable[[list[tuple[bytes, int]]], None] | None = None, meta_only: bool = False) -> None:
        self._index = index
        self._dispatcher = dispatcher
        # told the meta change records' bodies and ends (meta/journal.py), those added since the
        # last flush together: one write of the meta database for them, not one each
        self._on_meta = on_meta
        self._meta_only = meta_only  # apply meta change records, index nothing
        self._meta: list[tuple[bytes, int]] = []
        self._pending: list[DispatchItem] = []
        self._heads: dict[str, int] = {}  # the pending items' queues -> pack_state after them
        self.dispatched = 0  # records indexed (or dropping a queue) so far

    def add(self, position: int, view: RecordView) -> None:
        """The record at ``position``: indexed by the next ``flush``, or at once when it is the
        drop record of a queue (retention/reclaim.py; a control record has no queue slots of its
        own: an earlier version let clients publish to HOLD_TOPIC)."""
        end = position + view.size
        if view.topic == HOLD_TOPIC and view.body[:1] == META_OP and not view.queue_count:
            if self._on_meta is not None:
                self._meta.append((view.body, end))
            return
        if self._meta_only:
            return
        if view.topic == HOLD_TOPIC and view.body[:1] == DROP_OP and not view.queue_count:
            self.flush(position)
            self._dispatcher.drop([parse_drop(view.body)[2]], end)
            self.dispatched += 1
            return
        item = _dispatch_item(self._index, position, view)
        self._pending.append(item)
        heads = self._heads
        for name, qid, offset in item[4]:
            heads[name] = (offset + 1) << 32 | qid
        if len(self._pending) >= REDISPATCH_BATCH:
            self.flush(end)

    def add_records(self, log_: CommitLog, start: int, end: int) -> int:
        """``add`` each whole record from ``start`` up to ``end``; where the next record starts."""
        at = start
        for position, view in records(log_, start, end):
            self.add(position, view)
            at = position + view.size
        return at

    def flush(self, end: int) -> None:
        """Apply the meta changes added, then index what was added; the index's checkpoint moves
        to ``end`` (after the meta changes before it: recovery applies those after the checkpoint
        again)."""
        if self._meta and self._on_meta is not None:  # (only added with a callback)
            meta, self._meta = self._meta, []
            self._on_meta(meta)
        if self._pending:
            self._dispatcher.dispatch(self._pending, end, self._heads)
            self.dispatched += len(self._pending)
            self._pending = []
            self._heads = {}


@cython.locals(off=cython.Py_ssize_t, total=cython.Py_ssize_t, buf=bytes)
def records(log_: CommitLog, start: int, end: int) -> Iterator[tuple[int, RecordView]]:
    """The whole records from ``start`` (a record's start) up to ``end``, across segment rolls; a
    record cut short at ``end`` (a replica receiving its leader's bytes) is not yielded."""
    size = log_.segment_size
    at = start
    while at < end:
        seg = log_.segment_of(at)
        seg_end = min(seg.start + seg.length, end) if seg is not None else at
        if at >= seg_end:  # the rest of this segment is unused: the log rolled
            at = at - at % size + size
            continue
        buf = log_.read(at, seg_end - at)
        off = 0
        while len(buf) - off >= HEADER_SIZE:
            total = (cython.cast(cython.uchar, buf[off]) << 24 | cython.cast(cython.uchar, buf[off + 1]) << 16
                     | cython.cast(cython.uchar, buf[off + 2]) << 8 | cython.cast(cython.uchar, buf[off + 3]))
            if len(buf) - off < total:
                break
            try:
                view = RecordView(buf, off)
            except RecordCorruptError as exc:
                raise StoreError(f"record at {at + off} is damaged: {exc}") from None
            yield at + off, view
            off += total
        at += off
        if at < seg_end:  # a record the next bytes complete
            return


def _dispatch_item(index: ConsumeQueueIndex, position: int, view: RecordView) -> DispatchItem:
    if view.topic == HOLD_TOPIC:
        return _control_item(index, position, view)
    targets = []
    cache = index.cache
    for name, offset in view.queues():
        packed = cache.get(name)
        targets.append((name, (index.resolve(name) if packed is None else packed) & QID_MASK, offset))
    tags = view_tags(view)
    return (position, view.size, tag_hash(tags), view.store_ts, targets,
            key_prefixes(view.topic, view.key) if view.key else (), ())


def _control_item(index: ConsumeQueueIndex, position: int, view: RecordView) -> DispatchItem:
    """A control record's item, as the committer made it (batching.dispatch_items)."""
    control = ControlRecord(view.body)
    if control.op == HOLD:
        nested = RecordView(control.nested, 0)
        key = hold_key(control.kind, control.due_ms, position + nested_offset())
        value = hold_value(nested.size, tag_hash(view_tags(nested)), view.store_ts, [q for q, _ in nested.queues()])
        return (position, view.size, 0, view.store_ts, [], (), hold_writes(key, value))
    targets = [(name, index.resolve(name) & QID_MASK, offset) for name, offset in view.queues()]
    size = view.size | INDIRECT if control.op == RELEASE else view.size
    return (position, size, control.tag, view.store_ts, targets, (), hold_writes(control.key, None))


def view_tags(view: RecordView) -> str | None:
    raw = view.raw_properties
    if not raw or _TAGS_NAME not in raw:  # (no TAGS property: nothing to decode)
        return None
    return decode_properties(raw).get(TAGS_PROPERTY)
