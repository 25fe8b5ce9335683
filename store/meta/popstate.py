"""Pop consumption's durable state (RocketMQ's PopCheckPoint vocabulary), in the meta store.

A consumer group reading one queue by pop has a *pop offset* (where its next new message is)
and *check points*: one per message handed out and not yet acknowledged, keyed by the time it
becomes visible again. A check point that comes due is *revived*: moved to the group's ready
set of that queue, from which the next pop serves it again (no copy of the message). Keys:

    b"pO" + group + queue                  -> pop offset u64
    b"pT" + due_ms u64 + group + queue + offset u64  -> position u64, attempts u16   (invisible)
    b"pR" + group + queue + offset u64                -> position u64, attempts u16   (ready)

(group and queue: u16 length + UTF-8). ``attempts`` counts revivals: the message's reconsume
count. Every change is one WriteBatch in the meta store's WAL -- a pop (check points + pop
offset), an ack, a change of invisible time, a revival -- so after a crash the state is one
of before or after each change, never between: a message is in exactly one of unread (past
the pop offset), invisible, ready, or done. The WAL is written, not fsynced: a machine crash
can only lose the latest changes, which makes messages come back (at least once), never lose
them -- the meta WAL is ordered, so a lost pop takes its check points with it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rocksdict import Rdict, ReadOptions

from ..rocks import raw_items
from .journal import MetaBatch
from .tables import MetaWrites

OFFSET_PREFIX = b"pO"
INVISIBLE_PREFIX = b"pT"
READY_PREFIX = b"pR"
_U64 = struct.Struct(">Q")
_VALUE = struct.Struct(">QH")  # position, attempts


@dataclass(slots=True, frozen=True)
class CheckPoint:
    """One message handed out (or ready to be): where it is and how often it came back."""

    group: str
    queue: str
    offset: int
    position: int  # commitlog position of its record
    attempts: int  # revivals so far (its reconsume count)
    due_ms: int = 0  # invisible until (0: a ready one)


def _name(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("a group or queue name longer than 65535 bytes")
    return len(raw).to_bytes(2, "big") + raw


def _owner(group: str, queue: str) -> bytes:
    return _name(group) + _name(queue)


def _parse_owner(raw: bytes, at: int) -> tuple[str, str, int]:
    n = int.from_bytes(raw[at:at + 2], "big")
    group = raw[at + 2:at + 2 + n].decode()
    at += 2 + n
    n = int.from_bytes(raw[at:at + 2], "big")
    return group, raw[at + 2:at + 2 + n].decode(), at + 2 + n


def invisible_key(due_ms: int, group: str, queue: str, offset: int) -> bytes:
    return INVISIBLE_PREFIX + _U64.pack(due_ms) + _owner(group, queue) + _U64.pack(offset)


def ready_key(group: str, queue: str, offset: int) -> bytes:
    return READY_PREFIX + _owner(group, queue) + _U64.pack(offset)


def _upper(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes((prefix[-1] + 1,)) if prefix[-1] < 0xFF else prefix + b"\xff" * 8


class PopCheckPoints:
    """The pop state of every (group, queue), over the meta store's RocksDB."""

    def __init__(self, db: Rdict, writes: MetaWrites) -> None:
        self._db = db
        # ``MetaStore.writes``: a failed write raises StoreWriteError (a full disk); a replicated
        # leader's followers get each change (meta/journal.py)
        self._writes = writes

    def _write(self, batch: MetaBatch) -> None:
        self._writes.apply(batch, sync=False)

    # -- reads ---------------------------------------------------------------------------------
    def pop_offset(self, group: str, queue: str) -> int | None:
        raw = self._db.get(OFFSET_PREFIX + _owner(group, queue))
        return None if raw is None else _U64.unpack(raw)[0]

    def ready(self, group: str, queue: str, limit: int) -> list[CheckPoint]:
        """Revived messages of (group, queue) waiting to be popped again, lowest offset first."""
        prefix = READY_PREFIX + _owner(group, queue)
        opts = ReadOptions()
        opts.set_iterate_upper_bound(_upper(prefix))
        out: list[CheckPoint] = []
        for key, value in raw_items(self._db, prefix, opts):
            if len(out) >= limit:
                break
            position, attempts = _VALUE.unpack(value)
            out.append(CheckPoint(group, queue, _U64.unpack_from(key, len(prefix))[0], position, attempts))
        return out

    def invisible(self, group: str, queue: str, offset: int, due_ms: int) -> CheckPoint | None:
        """The check point a pop's answer named (its due time is the pop time + invisible time)."""
        value = self._db.get(invisible_key(due_ms, group, queue, offset))
        if value is None:
            return None
        position, attempts = _VALUE.unpack(value)
        return CheckPoint(group, queue, offset, position, attempts, due_ms)

    def due(self, now_ms: int, limit: int, from_ms: int = 0) -> list[CheckPoint]:
        """Check points due at or before ``now_ms`` (and from ``from_ms``: below it lie the
        tombstones of the ended ones, which a walk from the start would step over every time),
        earliest first, at most ``limit``."""
        opts = ReadOptions()
        opts.set_iterate_upper_bound(INVISIBLE_PREFIX + _U64.pack(now_ms + 1))
        out: list[CheckPoint] = []
        for key, value in raw_items(self._db, INVISIBLE_PREFIX + _U64.pack(from_ms), opts):
            if len(out) >= limit:
                break
            out.append(_invisible(key, value))
        return out

    def outstanding(self) -> Iterator[CheckPoint]:
        """Every check point, invisible then ready (tests, admin)."""
        for prefix in (INVISIBLE_PREFIX, READY_PREFIX):
            opts = ReadOptions()
            opts.set_iterate_upper_bound(_upper(prefix))
            for key, value in raw_items(self._db, prefix, opts):
                if prefix == INVISIBLE_PREFIX:
                    yield _invisible(key, value)
                else:
                    group, queue, at = _parse_owner(key, len(prefix))
                    position, attempts = _VALUE.unpack(value)
                    yield CheckPoint(group, queue, _U64.unpack_from(key, at)[0], position, attempts)

    # -- changes (one WriteBatch each) ---------------------------------------------------------
    def popped(self, group: str, queue: str, due_ms: int, revived: Iterable[CheckPoint], new: Iterable[CheckPoint],
               pop_offset: int | None, ready: Iterable[CheckPoint] = ()) -> None:
        """Messages handed out, invisible until ``due_ms``: ``revived`` ones leave the ready set,
        ``new`` ones were read at the pop offset, which moves to ``pop_offset`` (None: unchanged);
        ``ready`` ones, read there too, go to the ready set for another pop."""
        batch = MetaBatch()
        for cp in ready:
            batch.put(ready_key(group, queue, cp.offset), _VALUE.pack(cp.position, cp.attempts))
        for cp in revived:
            batch.delete(ready_key(group, queue, cp.offset))
            batch.put(invisible_key(due_ms, group, queue, cp.offset), _VALUE.pack(cp.position, cp.attempts))
        for cp in new:
            batch.put(invisible_key(due_ms, group, queue, cp.offset), _VALUE.pack(cp.position, cp.attempts))
        if pop_offset is not None:
            batch.put(OFFSET_PREFIX + _owner(group, queue), _U64.pack(pop_offset))
        self._write(batch)

    def forget(self, cp: CheckPoint) -> None:
        """A ready message that cannot be served again (retention removed its record)."""
        self._write(MetaBatch().delete(ready_key(cp.group, cp.queue, cp.offset)))

    def ack(self, points: Iterable[CheckPoint]) -> None:
        batch = MetaBatch()
        for cp in points:
            batch.delete(invisible_key(cp.due_ms, cp.group, cp.queue, cp.offset))
        self._write(batch)

    def change(self, cp: CheckPoint, due_ms: int) -> None:
        """Invisible until ``due_ms`` instead (CHANGE_MESSAGE_INVISIBLETIME)."""
        batch = MetaBatch()
        batch.delete(invisible_key(cp.due_ms, cp.group, cp.queue, cp.offset))
        batch.put(invisible_key(due_ms, cp.group, cp.queue, cp.offset), _VALUE.pack(cp.position, cp.attempts))
        self._write(batch)

    def revive(self, points: Iterable[CheckPoint]) -> None:
        """Due check points into their ready sets, one attempt more."""
        batch = MetaBatch()
        for cp in points:
            batch.delete(invisible_key(cp.due_ms, cp.group, cp.queue, cp.offset))
            batch.put(ready_key(cp.group, cp.queue, cp.offset), _VALUE.pack(cp.position, min(cp.attempts + 1, 0xFFFF)))
        self._write(batch)


def _invisible(key: bytes, value: bytes) -> CheckPoint:
    due = _U64.unpack_from(key, len(INVISIBLE_PREFIX))[0]
    group, queue, at = _parse_owner(key, len(INVISIBLE_PREFIX) + 8)
    position, attempts = _VALUE.unpack(value)
    return CheckPoint(group, queue, _U64.unpack_from(key, at)[0], position, attempts, due)
