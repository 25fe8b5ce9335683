"""Reading records back: index entries to stored messages (entries back to back in the commitlog
are read with one pread), and a record by its position."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..log.commitlog import CommitLog
from ..errors import RecordCorruptError
from ..holds.codec import INDIRECT, ControlRecord
from ..messages import StoredMessage
from ..log.record import HEADER_SIZE, RecordView

_READ_AHEAD = 4096  # bytes read at a position before the record's length is known


def read_entries(commitlog: CommitLog, id_prefix: str, queue: str, offsets: Sequence[int],
                 entries: list[tuple[int, int, int, int]], max_bytes: int) -> list[StoredMessage]:
    """The messages of ``entries`` (position, size, tag hash, store time) at ``offsets`` of
    ``queue``: at least one, then within ``max_bytes``."""
    # Coalesce entries that sit back to back in the commitlog into one pread.
    spans: list[tuple[int, int, int]] = []  # (position, end, entry count)
    total = 0
    for position, size, _, _ in entries:
        size &= ~INDIRECT
        if spans and total + size > max_bytes:
            break
        total += size
        if spans and spans[-1][1] == position:
            start, _, n = spans[-1]
            spans[-1] = (start, position + size, n + 1)
        else:
            spans.append((position, position + size, 1))
    messages: list[StoredMessage] = []
    i = 0
    for start, end, n in spans:
        buf = commitlog.read(start, end - start)
        at = 0
        for _ in range(n):
            position, size, tag, _ = entries[i]
            try:
                view = RecordView(buf, at)
                if size & INDIRECT:  # a release: the message is the held record it names
                    size &= ~INDIRECT
                    position, view = released(commitlog.read, view)
            except (RecordCorruptError, IndexError, ValueError) as exc:
                raise RecordCorruptError(
                    f"record at commitlog position {position} of queue {queue} offset {offsets[i]}: {exc}"
                ) from None
            messages.append(stored_message(view, id_prefix, position, queue, offsets[i], tag))
            at += size
            i += 1
    return messages


def released(read: Callable[[int, int], bytes], view: RecordView) -> tuple[int, RecordView]:
    """The held message a release record (``view``) names: its position and record."""
    control = ControlRecord(view.body)
    buf = read(control.target, control.target_size)
    if len(buf) < control.target_size:  # retention took the held record (holds/codec.py: rolled before)
        raise RecordCorruptError(f"held message at {control.target} is gone")
    return control.target, RecordView(buf, 0)


def record_at(commitlog: CommitLog, id_prefix: str, position: int) -> StoredMessage | None:
    if position < commitlog.min_position or position >= commitlog.end_position:
        return None
    buf = commitlog.read(position, _READ_AHEAD)
    if len(buf) < HEADER_SIZE:
        return None
    size = int.from_bytes(buf[:4], "big")
    if size > len(buf):
        buf = commitlog.read(position, size)
    try:
        view = RecordView(buf, 0)
    except (RecordCorruptError, IndexError, ValueError):
        return None
    return stored_message(view, id_prefix, position, "", -1, 0)


def stored_message(view: RecordView, id_prefix: str, position: int, queue: str, offset: int, tag: int) -> StoredMessage:
    return StoredMessage(
        None,
        position,
        view.size,
        view.topic,
        view.key,
        view.body,
        view.born_ts,
        view.store_ts,
        view.raw_properties,
        view.raw_queues,
        view.queue_count,
        queue,
        offset,
        tag,
        view.flags,
        None,
        id_prefix,
    )
