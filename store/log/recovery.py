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
from ..index.consumequeue import ConsumeQueueIndex
from ..index.dispatcher import Dispatcher
from ..errors import RecordCorruptError, StoreCorruptError
from .record import HEADER_SIZE, MAGIC_BYTES, RecordView
from .replay import Replay

log = logging.getLogger("tidemq.store.recovery")



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
            on_meta: Callable[[list[tuple[bytes, int]]], None] | None = None,
            index_tail: bool = True) -> RecoveryReport:
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
