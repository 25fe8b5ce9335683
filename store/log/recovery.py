"""Recovery at open: verify the commitlog tail, cut a torn write, re-dispatch what the index lacks.

The scan starts at the segment holding the index checkpoint and verifies every record
(magic, size, CRC) up to the end of the log. A bad record is a *torn tail* when it is in
the newest segment and no valid record follows it (a write cut short by a crash): it is
truncated. Anything else is *corruption*: the store refuses to start, naming file and
position, unless opened with ``repair=True``, which truncates at the damage and says how
much was dropped.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Iterator

from .commitlog import CommitLog, Segment
from ..index.consumequeue import QID_MASK, ConsumeQueueIndex
from ..index.dispatcher import Dispatcher, DispatchItem
from ..errors import RecordCorruptError, StoreCorruptError, StoreError
from ..holds.codec import (DROP, HOLD, META, HOLD_TOPIC, INDIRECT, RELEASE, ControlRecord, hold_key, hold_value, hold_writes,
                    nested_offset, parse_drop)
from ..index.keyindex import key_prefixes
from ..messages import TAGS_PROPERTY, tag_hash
from .record import HEADER_SIZE, MAGIC_BYTES, RecordView, decode_properties

log = logging.getLogger("tidemq.store.recovery")

REDISPATCH_BATCH = 8192
DROP_OP = bytes((DROP,))
META_OP = bytes((META,))


@dataclass(slots=True)
class RecoveryReport:
    scanned_from: int = 0
    end_position: int = 0
    records_verified: int = 0
    records_redispatched: int = 0
    torn_bytes_dropped: int = 0
    repaired_bytes_dropped: int = 0
    index_entries_removed: int = 0


@dataclass(slots=True)
class _Damage:
    segment: Segment
    offset: int  # within the segment file
    reason: str
    torn: bool


def recover(log_: CommitLog, index: ConsumeQueueIndex, dispatcher: Dispatcher, *, repair: bool,
            on_meta: Callable[[bytes, int], None] | None = None, index_tail: bool = True) -> RecoveryReport:
    """Verify the log from the index's checkpoint, cut a torn tail, index what the index lacks
    and apply the meta change records after the checkpoint (``on_meta``: replicated stores).
    ``index_tail`` False (a replica): what the index lacks is left unindexed, for the group to
    confirm first (store/replica/); meta changes are still applied, and undone if it is cut."""
    report = RecoveryReport()
    checkpoint = index.dispatched_position
    start = max(log_.min_position, checkpoint - checkpoint % log_.segment_size)
    report.scanned_from = start
    segments = [s for s in log_.segments() if s.start + log_.segment_size > start]
    replay = Replay(index, dispatcher, on_meta, meta_only=not index_tail)
    end = start
    damage: _Damage | None = None
    for i, seg in enumerate(segments):
        is_last = i == len(segments) - 1
        for pos, view, bad in _scan(seg, max(start, seg.start) - seg.start, is_last):
            if view is None:  # (damage: ``bad`` says where and why)
                damage = bad
                break
            report.records_verified += 1
            end = pos + view.size
            if pos >= checkpoint:
                replay.add(pos, view)
        if damage is not None:
            break
        end = seg.start + seg.length if seg.length else end

    if damage is not None:
        at = damage.segment.start + damage.offset
        if damage.torn:
            report.torn_bytes_dropped = log_.truncate(at)
            log.warning(
                "commitlog torn tail truncated file=%s position=%d bytes_dropped=%d reason=%s",
                damage.segment.path, damage.offset, report.torn_bytes_dropped, damage.reason,
            )
        elif repair:
            report.repaired_bytes_dropped = log_.truncate(at)
            log.warning(
                "commitlog repaired: truncated at damage file=%s position=%d bytes_dropped=%d reason=%s",
                damage.segment.path, damage.offset, report.repaired_bytes_dropped, damage.reason,
            )
        else:
            raise StoreCorruptError(
                f"commitlog corrupt in {damage.segment.path} at byte {damage.offset} "
                f"(position {at}): {damage.reason}; valid records follow it, so this is not a torn "
                "write. Start with --repair to truncate the log there (everything after it is dropped).",
                path=str(damage.segment.path),
                position=damage.offset,
            )
        end = at
    replay.flush(end)
    report.records_redispatched = replay.dispatched
    if index.dispatched_position > end:
        report.index_entries_removed = index.truncate_beyond(end)
        log.warning(
            "index was ahead of the commitlog; entries removed=%d position=%d",
            report.index_entries_removed, end,
        )
    report.end_position = log_.end_position
    return report


class Replay:
    """Records read back from the commitlog, indexed as the committer indexed them when it wrote
    them: by recovery, and by a follower for the bytes its leader sends (store/replica/)."""

    def __init__(self, index: ConsumeQueueIndex, dispatcher: Dispatcher,
                 on_meta: Callable[[bytes, int], None] | None = None, meta_only: bool = False) -> None:
        self._index = index
        self._dispatcher = dispatcher
        self._on_meta = on_meta  # told each meta change record's body and end (meta/journal.py)
        self._meta_only = meta_only  # apply meta change records, index nothing
        self._pending: list[DispatchItem] = []
        self.dispatched = 0  # records indexed (or dropping a queue) so far

    def add(self, position: int, view: RecordView) -> None:
        """The record at ``position``: indexed by the next ``flush``, or at once when it is the
        drop record of a queue (retention/reclaim.py; a control record has no queue slots of its
        own: an earlier version let clients publish to HOLD_TOPIC)."""
        end = position + view.size
        if view.topic == HOLD_TOPIC and view.body[:1] == META_OP and not view.queue_count:
            if self._on_meta is not None:
                self._on_meta(view.body, end)
            return
        if self._meta_only:
            return
        if view.topic == HOLD_TOPIC and view.body[:1] == DROP_OP and not view.queue_count:
            self.flush(position)
            self._dispatcher.drop([parse_drop(view.body)[2]], end)
            self.dispatched += 1
            return
        self._pending.append(_dispatch_item(self._index, position, view))
        if len(self._pending) >= REDISPATCH_BATCH:
            self.flush(end)

    def flush(self, end: int) -> None:
        """Index what was added; the index's checkpoint moves to ``end``."""
        if self._pending:
            self._dispatcher.dispatch(self._pending, end)
            self.dispatched += len(self._pending)
            self._pending = []


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
            total = int.from_bytes(buf[off:off + 4], "big")
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
    for name, offset in view.queues():
        targets.append((name, index.resolve(name) & QID_MASK, offset))
    tags = view_tags(view)
    return (position, view.size, tag_hash(tags), view.store_ts, targets, key_prefixes(view.topic, view.key), ())


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
    if not view.raw_properties:
        return None
    return decode_properties(view.raw_properties).get(TAGS_PROPERTY)


def _scan(seg: Segment, offset: int, is_last: bool) -> Iterator[tuple[int, RecordView | None, _Damage | None]]:
    """Yield (position, record, None) for each valid record, then (pos, None, damage) if any."""
    length = seg.length
    if length == 0 or offset >= length:
        return
    with mmap.mmap(seg.fd, length, prot=mmap.PROT_READ) as mm:
        while offset < length:
            reason = None
            if length - offset < HEADER_SIZE:
                reason = "incomplete record header"
            else:
                try:
                    view = RecordView(mm, offset)
                except RecordCorruptError as exc:
                    reason = str(exc)
            if reason is not None:
                torn = is_last and not _valid_record_after(mm, offset, length)
                yield seg.start + offset, None, _Damage(seg, offset, reason, torn)
                return
            yield seg.start + offset, view, None
            offset += view.size


def _valid_record_after(mm: mmap.mmap, offset: int, length: int) -> bool:
    """Is there any valid record after a bad one? (then the damage is not a torn tail)"""
    at = mm.find(MAGIC_BYTES, offset + 5)
    while at != -1:
        start = at - 4
        if start + HEADER_SIZE <= length:
            try:
                RecordView(mm, start)
                return True
            except RecordCorruptError:
                pass
        at = mm.find(MAGIC_BYTES, at + 1)
    return False
