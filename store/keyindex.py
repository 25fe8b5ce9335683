"""The message-key index (RocketMQ's IndexFile, kept in the consume-queue RocksDB instead):
topic + key -> commitlog positions, for "query message by key".

A record's ``key`` may hold several keys separated by spaces (RocketMQ's KEYS convention);
each is indexed. Entries are written by the dispatcher in the same WriteBatch as the queue
entries, so they are exactly as durable as the consume queues and rebuilt by recovery the
same way. Entries whose record retention removed are skipped when read (the positions are
below the commitlog's start) and dropped by the same query.
"""

from __future__ import annotations

import struct

KEY_PREFIX = b"k"
KEY_SEPARATOR = " "
_POSITION = struct.Struct(">Q")
_STORE_TS = struct.Struct(">q")


def key_prefixes(topic: str, key: str | None) -> tuple[bytes, ...]:
    """The index-key prefixes of one record (position bytes follow each), () if it has no key."""
    if not key:
        return ()
    head = KEY_PREFIX + topic.encode() + b"\x00"
    return tuple(
        head + k.encode() + b"\x00" for k in dict.fromkeys(key.split(KEY_SEPARATOR)) if k and "\x00" not in k
    )


def entry(prefix: bytes, position: int, store_ts: int) -> tuple[bytes, bytes]:
    return prefix + _POSITION.pack(position), _STORE_TS.pack(store_ts)


def scan(db, topic: str, key: str, *, min_position: int, begin_ms: int, end_ms: int,
         limit: int) -> tuple[list[int], list[bytes]]:
    """Positions of ``topic``'s records with ``key`` stored within [begin_ms, end_ms], newest
    last, at most ``limit`` (the newest ones); and the keys of entries retention made stale."""
    if "\x00" in key or not key:
        return [], []
    prefix = KEY_PREFIX + topic.encode() + b"\x00" + key.encode() + b"\x00"
    positions: list[int] = []
    stale: list[bytes] = []
    for raw_key, raw_value in db.items(from_key=prefix):
        if not raw_key.startswith(prefix):
            break
        if len(raw_key) != len(prefix) + _POSITION.size:
            continue  # a longer key that only shares this prefix
        (position,) = _POSITION.unpack_from(raw_key, len(prefix))
        if position < min_position:
            stale.append(raw_key)
            continue
        (store_ts,) = _STORE_TS.unpack(raw_value)
        if begin_ms <= store_ts <= end_ms:
            positions.append(position)
    return positions[-limit:] if limit > 0 else positions, stale
