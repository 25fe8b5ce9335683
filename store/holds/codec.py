"""Held messages (sans-IO codecs): a message written to the commitlog once and indexed into its
queues later -- at its delivery time (a timer message) or when its transaction commits (a
half message) -- or never (a rollback).

A held message is one *control record* (topic ``HOLD_TOPIC``, no queues) whose body is a hold
header and the message's own record, framed as every record is (its queue slots name the
target queues, offsets ``HELD``). The dispatcher gives it no queue entries; it writes a *hold
key* to the index instead, sorted by due time:

    b"h" + kind u8 + due_ms u64 + target u64  -> size u32, tag_hash i64, hold_ts i64, checks u16, queue names
    b"hP" + target u64                        -> its hold key (the same holds by position)

The second key orders the same holds by position: retention finds there the held messages in
the segments it is about to delete and *rolls* them (copies them forward, same due time) first.

``target`` is the commitlog position of the nested record (a valid record position: reads,
message ids and ``record_at`` work on it as on any other).

Releasing it writes a second, small control record: its queue slots are the target queues with
the offsets given now, its body names the target and the hold key. It is indexed like any
record, with the ``INDIRECT`` bit in its entries' size, so a reader of the entry reads the
release record and then the nested one; the dispatcher deletes the hold key in the same
WriteBatch. So a queue's entries keep following the commitlog forward (retention and crash
truncation rely on it), the message body is written once, and everything -- hold keys, releases,
discards -- is rebuilt by re-dispatching the commitlog after a crash, like any entry.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..errors import RecordCorruptError
from ..log.record import HEADER_SIZE

HOLD_TOPIC = "%HOLD%"  # control records' topic: never a queue's (no queue is named after it)
HOLD_PREFIX = b"h"
TIMER = ord("T")  # held until its due time
HALF = ord("X")  # held until its transaction commits or rolls back (``due``: its next check)
KINDS = (TIMER, HALF)

# control record bodies: the first byte says which
HOLD = ord("H")
RELEASE = ord("R")
DISCARD = ord("D")
DROP = ord("Q")  # a queue removed (retention/reclaim.py): its qid, next offset and name
META = ord("M")  # changes to the meta database, for followers to apply (meta/journal.py)

HELD = (1 << 64) - 1  # the queue offset of a held message's nested record: none given yet
INDIRECT = 1 << 31  # in an index entry's size: the entry's record is a release; read its target

_HOLD_HEAD = struct.Struct(">BBQ")  # HOLD, kind, due_ms; then the nested record
_HOLD_KEY = struct.Struct(">cBQQ")
_HOLD_VALUE = struct.Struct(">IqqH")
_RELEASE_HEAD = struct.Struct(">BQIq")  # RELEASE, target, target size, its tag hash; then the hold key
HOLD_HEAD_SIZE = _HOLD_HEAD.size
HOLD_KEY_SIZE = _HOLD_KEY.size


def hold_body(kind: int, due_ms: int, nested: bytes) -> bytes:
    return _HOLD_HEAD.pack(HOLD, kind, due_ms) + nested


def release_body(target: int, target_size: int, tag: int, key: bytes) -> bytes:
    return _RELEASE_HEAD.pack(RELEASE, target, target_size, tag) + key


def discard_body(key: bytes) -> bytes:
    return bytes((DISCARD,)) + key


_DROP_HEAD = struct.Struct(">BIQ")  # DROP, qid, the queue's next offset; then its name (UTF-8)


def drop_body(qid: int, next_offset: int, name: str) -> bytes:
    return _DROP_HEAD.pack(DROP, qid, next_offset) + name.encode()


def parse_drop(body: bytes) -> tuple[int, int, str]:
    """(qid, next offset, name) of a drop record's body."""
    if len(body) < _DROP_HEAD.size:
        raise RecordCorruptError("short drop record")
    _, qid, next_offset = _DROP_HEAD.unpack_from(body)
    return qid, next_offset, body[_DROP_HEAD.size:].decode()


def hold_key(kind: int, due_ms: int, target: int) -> bytes:
    return _HOLD_KEY.pack(HOLD_PREFIX, kind, due_ms, target)


POSITION_PREFIX = HOLD_PREFIX + b"P"


def position_key(target: int) -> bytes:
    return POSITION_PREFIX + target.to_bytes(8, "big")


def hold_writes(key: bytes, value: bytes | None) -> tuple[tuple[bytes, bytes | None], ...]:
    """The index writes of a hold (``value``) or of its end (None): both of its keys."""
    target = key[-8:]
    return ((key, value), (POSITION_PREFIX + target, None if value is None else key))


def kind_prefix(kind: int) -> bytes:
    return HOLD_PREFIX + bytes((kind,))


def parse_hold_key(key: bytes) -> tuple[int, int, int]:
    """(kind, due_ms, target) of a hold key."""
    _, kind, due, target = _HOLD_KEY.unpack(key)
    return kind, due, target


def hold_value(size: int, tag: int, hold_ts: int, queues: Sequence[str], checks: int = 0) -> bytes:
    parts = [_HOLD_VALUE.pack(size, tag, hold_ts, min(checks, 0xFFFF))]
    for name in queues:
        raw = name.encode()
        parts.append(len(raw).to_bytes(2, "big") + raw)
    return b"".join(parts)


def parse_hold_value(value: bytes) -> tuple[int, int, int, int, list[str]]:
    """(nested record size, tag hash, store time of the hold, checks, target queues) of a hold
    key's value (``checks``: how often a half message's producer was asked; rewritten by
    ``HeldMessages.reschedule``, not logged: a crash may forget some)."""
    size, tag, hold_ts, checks = _HOLD_VALUE.unpack_from(value)
    queues = []
    at = _HOLD_VALUE.size
    while at < len(value):
        n = int.from_bytes(value[at:at + 2], "big")
        queues.append(value[at + 2:at + 2 + n].decode())
        at += 2 + n
    return size, tag, hold_ts, checks, queues


def nested_offset() -> int:
    """Where a hold record's nested record starts, from the hold record's position (the control
    record has no key, properties or queues: header, topic, hold header)."""
    return HEADER_SIZE + len(HOLD_TOPIC.encode()) + HOLD_HEAD_SIZE


class ControlRecord:
    """A control record's body, parsed: ``op`` is HOLD, RELEASE, DISCARD or DROP."""

    __slots__ = ("due_ms", "key", "kind", "nested", "op", "tag", "target", "target_size")

    def __init__(self, body: bytes) -> None:
        if not body:
            raise RecordCorruptError("empty control record")
        self.op = body[0]
        self.kind = self.due_ms = self.target = self.target_size = self.tag = 0
        self.key = b""
        self.nested = b""
        if self.op == HOLD:
            if len(body) < HOLD_HEAD_SIZE:
                raise RecordCorruptError("short hold record")
            _, self.kind, self.due_ms = _HOLD_HEAD.unpack_from(body)
            self.nested = body[HOLD_HEAD_SIZE:]
        elif self.op == RELEASE:
            if len(body) != _RELEASE_HEAD.size + HOLD_KEY_SIZE:
                raise RecordCorruptError("bad release record")
            _, self.target, self.target_size, self.tag = _RELEASE_HEAD.unpack_from(body)
            self.key = body[_RELEASE_HEAD.size:]
        elif self.op == DISCARD:
            if len(body) != 1 + HOLD_KEY_SIZE:
                raise RecordCorruptError("bad discard record")
            self.key = body[1:]
        elif self.op == DROP:
            parse_drop(body)  # (checked; retention/reclaim.py reads it)
        else:
            raise RecordCorruptError(f"unknown control record {self.op:#x}")
