"""Idempotent puts: a producer (a gateway node) numbers its puts, and a put sent again -- its
answer lost with a failed store leader -- is answered as the first time, not written twice.

Each numbered put leaves a *mark* in the meta database, written right after its records in the
same commit: so a replica holds a put's mark only if it holds the put (the mark follows the
records in the log that replicas copy), and the mark of a put cut from a replica's tail is
undone with it (meta/journal.py). A crash between the records and the mark leaves a put that
a resend writes again: at least once, never lost.

    b"i" + producer + 0x00 + seq u64 -> store ms i64, then per message: position u64, size u32

A producer's marks older than ``WINDOW`` puts are deleted as new ones are written.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence

from ..errors import InvalidMessageError
from ..messages import PutResult
from ..meta.journal import MetaBatch

PREFIX = b"i"
WINDOW = 10_000  # puts per producer that can still be sent again (a gateway node's writes in a failover)
MAX_PRODUCER = 64
_SEQ = struct.Struct(">Q")
_HEAD = struct.Struct(">qI")
_PLACE = struct.Struct(">QI")

Producer = tuple[bytes, int]  # the producer's id, the put's sequence number


def mark_key(producer: bytes, seq: int) -> bytes:
    return PREFIX + producer + b"\x00" + _SEQ.pack(seq)


def check_producer(producer: Producer) -> None:
    name, seq = producer
    if not 0 < len(name) <= MAX_PRODUCER or b"\x00" in name:
        raise InvalidMessageError(f"a producer id is 1 to {MAX_PRODUCER} bytes without NUL")
    if not 0 < seq < 1 << 63:
        raise InvalidMessageError("a put's sequence number is from 1 to 2**63 - 1")


def encode_mark(store_ts: int, places: Sequence[tuple[int, int]]) -> bytes:
    return _HEAD.pack(store_ts, len(places)) + b"".join(_PLACE.pack(p, s) for p, s in places)


def decode_mark(raw: bytes, id_prefix: str) -> list[PutResult]:
    """The put's results as first answered, without queue offsets (its producer asked for none)."""
    store_ts, count = _HEAD.unpack_from(raw)
    places = [_PLACE.unpack_from(raw, _HEAD.size + i * _PLACE.size) for i in range(count)]
    return [PutResult(id_prefix, position, size, store_ts, {}) for position, size in places]


class ProducerMarks:
    """The committer's side: which submitted puts carry a number (``numbered``), and the meta
    batch that marks them once their records are appended (``marks``)."""

    __slots__ = ("numbered",)

    def __init__(self) -> None:
        self.numbered: dict[asyncio.Future, Producer] = {}

    def marks(self, futures: Sequence[asyncio.Future], counts: Sequence[int], positions: Sequence[int],
              records: Sequence[bytes], store_ts: int) -> MetaBatch | None:
        """The marks of the numbered puts among ``futures`` (each put's ``counts`` records, in
        order, at ``positions``), each with the deletion of its producer's mark ``WINDOW`` back."""
        numbered = self.numbered
        batch = None
        start = 0
        for fut, count in zip(futures, counts):
            producer = numbered.pop(fut, None)
            if producer is not None:
                name, seq = producer
                places = [(positions[i], len(records[i])) for i in range(start, start + count)]
                batch = batch or MetaBatch()
                batch.put(mark_key(name, seq), encode_mark(store_ts, places))
                if seq > WINDOW:
                    batch.delete(mark_key(name, seq - WINDOW))
            start += count
        return batch

    def forget(self, futures: Sequence[asyncio.Future]) -> None:
        """Puts that failed before they were written: nothing to mark."""
        for fut in futures:
            self.numbered.pop(fut, None)
