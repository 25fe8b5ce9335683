"""Changes to the meta database as data: puts, deletes and range deletes, applied in one RocksDB
WriteBatch, and encoded for the commitlog so that followers apply the same changes in the same
order (sessions, offsets, retained messages, declarations, pop state: what a promoted follower
must hold, not just the messages). A change record is a control record (holds/codec.py, op
META) whose body is the encoded batch.

A journaled change also carries what each key held before it (a range delete is journaled as
the deletes of the keys it found), so that a replica that cuts a tail no one confirmed can undo
that tail's changes too (``undo``), newest first.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator

from rocksdict import WriteBatch

from ..errors import StoreError
from ..holds.codec import META

PUT, DELETE, DELETE_RANGE = 1, 2, 3
_OP = struct.Struct(">BIIBI")  # op, key (or range start) size, value (or range end) size, had a value before, its size
META_OP = bytes((META,))

# (op, key or range start, value or range end (b"" for a delete), the key's value before or None)
Change = tuple[int, bytes, bytes, bytes | None]


class MetaBatch:
    """Changes to apply together (all or none), in order."""

    __slots__ = ("changes",)

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def put(self, key: bytes, value: bytes) -> MetaBatch:
        self.changes.append((PUT, key, bytes(value), None))
        return self

    def delete(self, key: bytes) -> MetaBatch:
        self.changes.append((DELETE, key, b"", None))
        return self

    def delete_range(self, start: bytes, end: bytes) -> MetaBatch:
        self.changes.append((DELETE_RANGE, start, end, None))
        return self

    def with_before(self, get: Callable[[bytes], bytes | None],
                    keys_in: Callable[[bytes, bytes], Iterable[bytes]]) -> MetaBatch:
        """The batch to journal: each change with what its key holds now (before the batch), and
        range deletes as the deletes of the keys in the range."""
        out = MetaBatch()
        seen: dict[bytes, bytes | None] = {}  # a key changed twice in the batch: its value in between

        def before(key: bytes) -> bytes | None:
            return seen[key] if key in seen else get(key)

        for op, key, value, _ in self.changes:
            if op == DELETE_RANGE:
                present = {k for k in keys_in(key, value) if k not in seen}
                present |= {k for k, v in seen.items() if v is not None and key <= k < value}
                for found in sorted(present):
                    out.changes.append((DELETE, found, b"", before(found)))
                    seen[found] = None
                continue
            out.changes.append((op, key, value, before(key)))
            seen[key] = value if op == PUT else None
        return out

    def undo(self) -> MetaBatch:
        """The changes that put every key back as it was before this (journaled) batch."""
        out = MetaBatch()
        for op, key, _, before in reversed(self.changes):
            if op == DELETE_RANGE:
                raise StoreError("a journaled batch has no range deletes")
            if before is None:
                out.delete(key)
            else:
                out.put(key, before)
        return out

    def __len__(self) -> int:
        return len(self.changes)

    def write_batch(self) -> WriteBatch:
        batch = WriteBatch(raw_mode=True)
        for op, key, value, _ in self.changes:
            if op == PUT:
                batch.put(key, value)
            elif op == DELETE:
                batch.delete(key)
            else:
                batch.delete_range(key, value)
        return batch

    def encode(self) -> bytes:
        """The control record's body: META, then each change."""
        return META_OP + b"".join(
            _OP.pack(op, len(key), len(value), before is not None, len(before or b"")) + key + value + (before or b"")
            for op, key, value, before in self.changes)

    @classmethod
    def decode(cls, body: bytes) -> MetaBatch:
        batch = cls()
        batch.changes = list(_changes(body))
        return batch


def _changes(body: bytes) -> Iterator[Change]:
    if body[:1] != META_OP:
        raise StoreError("not a meta change record")
    at = 1
    while at < len(body):
        if len(body) - at < _OP.size:
            raise StoreError("meta change record cut short")
        op, n_key, n_value, had, n_before = _OP.unpack_from(body, at)
        at += _OP.size
        if op not in (PUT, DELETE, DELETE_RANGE) or at + n_key + n_value + n_before > len(body):
            raise StoreError(f"bad meta change (op {op}) in a change record")
        key, value = body[at:at + n_key], body[at + n_key:at + n_key + n_value]
        at += n_key + n_value
        yield op, key, value, body[at:at + n_before] if had else None
        at += n_before


class MetaReplay:
    """The meta change records of the log, applied and undone in place, and how far the meta
    database reflects the log (``applied``: the end of the last record applied, or of the log
    after recovery, which applies every record after the index's checkpoint)."""

    def __init__(self, apply: Callable[[MetaBatch], None]) -> None:
        self._apply = apply  # MetaWrites.apply, without the journal
        self.applied = 0

    def apply(self, body: bytes, end: int) -> None:
        """Apply the record ending at ``end``, unless it is applied already (a replica's
        recovery applies its whole log; its follower then reads the confirmed part again)."""
        self.apply_records([(body, end)])

    def apply_records(self, records: list[tuple[bytes, int]]) -> None:
        """``apply`` each record (body, end), in log order, in one write of the meta database
        (in ``sync`` flush mode one fsync, not one a record)."""
        together = MetaBatch()
        end = self.applied
        for body, record_end in records:
            if record_end > end:
                together.changes.extend(MetaBatch.decode(body).changes)
                end = record_end
        if end == self.applied:
            return
        self._apply(together)
        self.applied = end

    def undo(self, body: bytes) -> None:
        """Put back what a record changed (its tail of the log is being cut)."""
        self._apply(MetaBatch.decode(body).undo())
