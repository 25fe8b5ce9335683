"""Idempotent puts: a producer (a gateway node) numbers its puts, and a put sent again -- its
answer lost with a failed store leader -- is answered as the first time, not written twice.

The numbered puts of one commit leave one *mark* per producer in the meta database, written
right after their records in the same commit: so a replica holds a put's mark only if it holds
the put (the mark follows the records in the log that replicas copy), and the mark of a put cut
from a replica's tail is undone with it (meta/journal.py). A crash between the records and the
mark leaves puts that a resend writes again: at least once, never lost.

    b"i" + minute u32 + producer + 0x00 + last seq u64
        -> store ms i64, then per put: seq u64, count u32, then per message: position u64, size u32

``minute``: the store's minute of the commit. A put is sent again within a failover (seconds),
so ``find`` looks only at the last few minutes' marks, and every replica deletes older ones by
itself (``forget_before``).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterator, Sequence

from ..errors import InvalidMessageError
from ..messages import PutResult
from ..meta.journal import MetaBatch
from .batching import NESTED, PreparedMessage

PREFIX = b"i"
MAX_PRODUCER = 64
LOOKBACK_MIN = 3  # minutes of marks a put sent again is looked for in
KEEP_MIN = 10  # minutes of marks kept
_MINUTE = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_HEAD = struct.Struct(">q")
_PUT = struct.Struct(">QI")
_PLACE = struct.Struct(">QI")

Producer = tuple[bytes, int]  # the producer's id, the put's sequence number
Places = list[tuple[int, int]]  # (position, size) of each of a put's records


def check_producer(producer: Producer) -> None:
    name, seq = producer
    if not 0 < len(name) <= MAX_PRODUCER or b"\x00" in name:
        raise InvalidMessageError(f"a producer id is 1 to {MAX_PRODUCER} bytes without NUL")
    if not 0 < seq < 1 << 63:
        raise InvalidMessageError("a put's sequence number is from 1 to 2**63 - 1")


def _prefix(minute: int, name: bytes) -> bytes:
    return PREFIX + _MINUTE.pack(minute) + name + b"\x00"


def encode_mark(store_ts: int, puts: Sequence[tuple[int, Places]]) -> bytes:
    parts = [_HEAD.pack(store_ts)]
    for seq, places in puts:
        parts.append(_PUT.pack(seq, len(places)))
        parts += [_PLACE.pack(position, size) for position, size in places]
    return b"".join(parts)


def places_in(raw: bytes, seq: int) -> tuple[int, Places] | None:
    """(store ms, places) of put ``seq`` in a mark, None if it is not there."""
    (store_ts,) = _HEAD.unpack_from(raw)
    at = _HEAD.size
    while at < len(raw):
        put, count = _PUT.unpack_from(raw, at)
        at += _PUT.size
        if put == seq:
            return store_ts, [_PLACE.unpack_from(raw, at + i * _PLACE.size) for i in range(count)]
        at += count * _PLACE.size
    return None


def find(items_from: Callable[[bytes], Iterator[tuple[bytes, bytes]]], producer: Producer, now_ms: int,
         id_prefix: str) -> list[PutResult] | None:
    """The results of a numbered put as first answered, without their queue offsets (its
    records hold them), from its mark among the last ``LOOKBACK_MIN`` minutes'; None: no mark."""
    name, seq = producer
    now_min = now_ms // 60_000
    for minute in range(now_min + 1, now_min - LOOKBACK_MIN - 1, -1):
        prefix = _prefix(minute, name)
        for looked, (key, raw) in enumerate(items_from(prefix + _SEQ.pack(seq))):
            if not key.startswith(prefix) or looked >= 8:
                break
            found = places_in(raw, seq)
            if found is not None:
                store_ts, places = found
                return [PutResult(id_prefix, position, size, store_ts, {}) for position, size in places]
    return None


def forget_before(now_ms: int) -> MetaBatch:
    """The deletion of marks older than ``KEEP_MIN`` minutes (each replica's own housekeeping)."""
    oldest = max(0, now_ms // 60_000 - KEEP_MIN)
    return MetaBatch().delete_range(PREFIX, PREFIX + _MINUTE.pack(oldest))


class ProducerMarks:
    """The committer's side: which submitted puts carry a number (``numbered``), and the meta
    batch that marks them once their records are appended (``marks``)."""

    __slots__ = ("numbered",)

    def __init__(self) -> None:
        # a put's number, or one number per message of a put (each message a put of its own)
        self.numbered: dict[asyncio.Future, Producer | list[Producer]] = {}

    def marks(self, futures: Sequence[asyncio.Future], groups: Sequence[Sequence[PreparedMessage]],
              positions: Sequence[int], records: Sequence[bytes], store_ts: int) -> MetaBatch | None:
        """One mark per producer for the numbered puts among ``futures`` (each put's messages
        ``groups``, their records in order at ``positions``): the places the put's results name
        (a held message's nested record, as ``put_results`` names it)."""
        numbered = self.numbered
        by_producer: dict[bytes, list[tuple[int, Places]]] = {}
        start = 0
        for fut, group in zip(futures, groups):
            producer = numbered.pop(fut, None)
            if producer is not None:
                places = [(positions[i] + NESTED, p.size) if p.hold_kind else (positions[i], len(records[i]))
                          for i, p in enumerate(group, start)]
                if isinstance(producer, list):  # (one number per message)
                    for (name, seq), place in zip(producer, places):
                        by_producer.setdefault(name, []).append((seq, [place]))
                else:
                    name, seq = producer
                    by_producer.setdefault(name, []).append((seq, places))
            start += len(group)
        if not by_producer:
            return None
        batch = MetaBatch()
        minute = store_ts // 60_000
        for name, puts in by_producer.items():
            last = max(seq for seq, _ in puts)
            batch.put(_prefix(minute, name) + _SEQ.pack(last), encode_mark(store_ts, puts))
        return batch

    def forget(self, futures: Sequence[asyncio.Future]) -> None:
        """Puts that failed before they were written: nothing to mark."""
        for fut in futures:
            self.numbered.pop(fut, None)
