"""The message-key index (RocketMQ's IndexFile, kept in the consume-queue RocksDB instead):
topic + key -> commitlog positions, for "query message by key" -- within a topic, or in every
topic (a seek per topic that has keys, for ids that come without their topic).

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


def scan_every_topic(db, key: str, *, min_position: int, limit: int,
                     max_topics: int) -> tuple[list[int], list[bytes], bool]:
    """Positions of the records of any topic with ``key``, at most ``limit`` (in topic order);
    the keys of entries retention made stale; and False when more than ``max_topics`` topics
    have keys (the rest were not searched)."""
    if "\x00" in key or not key:
        return [], [], True
    wanted = key.encode() + b"\x00"
    positions: list[int] = []
    stale: list[bytes] = []
    it = db.iter()
    it.seek(KEY_PREFIX)
    for _ in range(max_topics):
        if not it.valid() or not it.key().startswith(KEY_PREFIX):
            return positions, stale, True
        head = it.key()
        end = head.find(b"\x00", len(KEY_PREFIX))
        if end < 0:
            return positions, stale, True  # (not an entry of this index: none follow)
        head = head[:end + 1]  # KEY_PREFIX + topic + NUL
        prefix = head + wanted
        it.seek(prefix)
        while it.valid() and len(positions) < limit:
            raw_key = it.key()
            if not raw_key.startswith(prefix):
                break
            if len(raw_key) == len(prefix) + _POSITION.size:
                (position,) = _POSITION.unpack_from(raw_key, len(prefix))
                if position < min_position:
                    stale.append(raw_key)
                else:
                    positions.append(position)
            it.next()
        if len(positions) >= limit:
            return positions, stale, True
        it.seek(head[:-1] + b"\x01")  # past every key of this topic
    return positions, stale, not (it.valid() and it.key().startswith(KEY_PREFIX))
