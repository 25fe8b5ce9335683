# cython: annotation_typing=False
# distutils: libraries = z
"""Records read back from the commitlog and indexed as the committer indexed them when it wrote
them: by recovery (recovery.py) and by a replica's follower for the bytes its leader sends
(store/replica/). On a follower this is the message path: compiled (setup.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import zlib

import cython

from ..errors import RecordCorruptError, StoreError
from ..holds.codec import (DROP, HOLD, HOLD_TOPIC, INDIRECT, META, RELEASE, ControlRecord, hold_key, hold_value,
                           hold_writes, nested_offset, parse_drop)
from ..index.consumequeue import QID_MASK, ConsumeQueueIndex
from ..index.dispatcher import Dispatcher, DispatchItem
from ..index.keyindex import key_prefixes
from ..messages import TAGS_PROPERTY, tag_hash
from .commitlog import CommitLog
from .record import HEADER_SIZE, MAGIC, QUEUE_SLOT_OVERHEAD, RecordView, decode_properties

if cython.compiled:
    from cython.cimports.cpython.bytes import PyBytes_AS_STRING
    from cython.cimports.store.log.zlib_crc import crc32 as c_crc32

REDISPATCH_BATCH = 8192
DROP_OP = bytes((DROP,))
META_OP = bytes((META,))
_TAGS_NAME = len(TAGS_PROPERTY).to_bytes(2, "big") + TAGS_PROPERTY.encode()  # as a properties block names it
_HOLD_TOPIC = HOLD_TOPIC.encode()


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
                if len(self._meta) >= REDISPATCH_BATCH:  # (a stretch of meta changes is written in bounded batches)
                    self.flush(end)
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

    @cython.locals(off=cython.Py_ssize_t, total=cython.Py_ssize_t, buf=bytes)
    def add_records(self, log_: CommitLog, start: int, end: int) -> int:
        """``add`` each whole record from ``start`` up to ``end`` (as ``records`` reads them);
        where the next record starts. Ordinary messages are indexed from their bytes
        (``_add_plain``), the others through a ``RecordView``."""
        last = start
        qids: dict[bytes, tuple[str, int]] = {}  # queue names met in this call -> (name, qid)
        for at, buf in _stretches(log_, start, end):
            off = 0
            while len(buf) - off >= HEADER_SIZE:
                total = _u32(buf, off)
                if len(buf) - off < total:
                    break
                if not self._add_plain(buf, off, at + off, qids):
                    view = _view(buf, off, at)
                    if view.topic == HOLD_TOPIC:
                        qids.clear()  # (a drop record may take a name's queue away)
                    self.add(at + off, view)
                off += total
                last = at + off
            if off < len(buf):  # a record the next bytes complete
                break
        return last

    @cython.locals(buf=bytes, off=cython.Py_ssize_t, total=cython.Py_ssize_t, lt=cython.Py_ssize_t,
                   lk=cython.Py_ssize_t, lp=cython.Py_ssize_t, lb=cython.Py_ssize_t, qc=cython.Py_ssize_t,
                   i=cython.Py_ssize_t, qend=cython.Py_ssize_t, n=cython.Py_ssize_t, k=cython.Py_ssize_t)
    def _add_plain(self, buf: bytes, off: int, position: int, qids: dict[bytes, tuple[str, int]]) -> bool:
        """Index the record at ``off`` of ``buf`` from its bytes, as ``add`` would from its view,
        when it is an ordinary message: not a control record, no key, no TAGS property, sound.
        False (nothing done): it is not one, and ``add`` reads it through a ``RecordView``."""
        total = _u32(buf, off)
        if _u32(buf, off + 4) != MAGIC or self._meta_only:
            return False
        qc, lt, lk = _u16(buf, off + 32), _u16(buf, off + 34), _u16(buf, off + 36)
        lp, lb = _u32(buf, off + 38), _u32(buf, off + 42)
        if lk or total < HEADER_SIZE + lt + lp + lb + QUEUE_SLOT_OVERHEAD * qc:
            return False
        i = off + HEADER_SIZE
        topic = buf[i:i + lt]
        if topic == _HOLD_TOPIC or not topic.isascii():  # (RecordView decodes any other, or refuses it)
            return False
        i += lt
        if lp and buf.find(_TAGS_NAME, i, i + lp) >= 0:
            return False
        if _crc(buf, off + 12, off + total) != _u32(buf, off + 8):
            return False
        i += lp
        qend = off + total - lb
        slots = []
        for k in range(qc):
            if qend - i < 2:
                return False
            n = _u16(buf, i)
            if qend - i < 2 + n + 8:
                return False
            raw = buf[i + 2:i + 2 + n]
            if raw not in qids and not raw.isascii():
                return False  # (RecordView decodes it, or refuses the record)
            slots.append((raw, _u64(buf, i + 2 + n)))
            i += 2 + n + 8
        if i != qend:
            return False
        index = self._index  # (queues are resolved, made if new, only for a record taken whole)
        targets = []
        for raw, offset in slots:
            known = qids.get(raw)
            if known is None:
                name = raw.decode()
                packed = index.cache.get(name)
                known = qids[raw] = (name, (index.resolve(name) if packed is None else packed) & QID_MASK)
            targets.append((known[0], known[1], offset))
        heads = self._heads
        for name, qid, offset in targets:
            heads[name] = (offset + 1) << 32 | qid
        self._pending.append((position, total, 0, _i64(buf, off + 24), targets, (), ()))
        if len(self._pending) >= REDISPATCH_BATCH:
            self.flush(position + total)
        return True

    def discard(self) -> None:
        """Forget what was added and not flushed (a flush failed: the records are added again)."""
        self._meta = []
        self._pending = []
        self._heads = {}

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
    for at, buf in _stretches(log_, start, end):
        off = 0
        while len(buf) - off >= HEADER_SIZE:
            total = _u32(buf, off)
            if len(buf) - off < total:
                break
            yield at + off, _view(buf, off, at)
            off += total
        if off < len(buf):  # a record the next bytes complete
            return


def _stretches(log_: CommitLog, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(position, bytes) of the log from ``start`` up to ``end``, a segment's used part at a
    time (the unused rest of a segment the log rolled from is skipped)."""
    size = log_.segment_size
    at = start
    while at < end:
        seg = log_.segment_of(at)
        seg_end = min(seg.start + seg.length, end) if seg is not None else at
        if at >= seg_end:
            at = at - at % size + size
            continue
        yield at, log_.read(at, seg_end - at)
        at = seg_end


def _view(buf: bytes, off: int, at: int) -> RecordView:
    """The record at ``off`` of the stretch read at ``at``; StoreError if it is damaged."""
    try:
        return RecordView(buf, off)
    except RecordCorruptError as exc:
        raise StoreError(f"record at {at + off} is damaged: {exc}") from None


@cython.cfunc
@cython.inline
@cython.locals(data=bytes, at=cython.Py_ssize_t)
@cython.returns(cython.Py_ssize_t)
@cython.exceptval(check=False)
def _u16(data, at):
    """The big-endian u16 at ``at`` (the caller checked the bounds)."""
    return (cython.cast(cython.Py_ssize_t, cython.cast(cython.uchar, data[at])) << 8
            | cython.cast(cython.uchar, data[at + 1]))


@cython.cfunc
@cython.inline
@cython.locals(data=bytes, at=cython.Py_ssize_t)
@cython.returns(cython.Py_ssize_t)
@cython.exceptval(check=False)
def _u32(data, at):
    """The big-endian u32 at ``at`` (the caller checked the bounds)."""
    return _u16(data, at) << 16 | _u16(data, at + 2)


@cython.cfunc
@cython.inline
@cython.locals(data=bytes, at=cython.Py_ssize_t)
@cython.returns(cython.ulonglong)
@cython.exceptval(check=False)
def _u64(data, at):
    """The big-endian u64 at ``at`` (the caller checked the bounds)."""
    return cython.cast(cython.ulonglong, _u32(data, at)) << 32 | _u32(data, at + 4)


@cython.cfunc
@cython.inline
@cython.locals(data=bytes, at=cython.Py_ssize_t, value=cython.ulonglong)
@cython.returns(cython.longlong)
@cython.exceptval(check=False)
def _i64(data, at):
    """The big-endian i64 at ``at`` (the caller checked the bounds)."""
    value = _u64(data, at)
    if cython.compiled:
        return cython.cast(cython.longlong, value)
    return value - (1 << 64) if value >> 63 else value


@cython.cfunc
@cython.inline
@cython.locals(data=bytes, start=cython.Py_ssize_t, end=cython.Py_ssize_t)
@cython.returns(cython.uint)
@cython.exceptval(check=False)
def _crc(data, start, end):
    """CRC32 of ``data[start:end]``, without copying it (as the record codec checks it)."""
    if cython.compiled:
        return c_crc32(0, cython.cast(cython.p_uchar, PyBytes_AS_STRING(data)) + start,
                       cython.cast(cython.uint, end - start))
    return zlib.crc32(memoryview(data)[start:end])


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
