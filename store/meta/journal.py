"""Changes to the meta database as data: puts, deletes and range deletes, applied in one RocksDB
WriteBatch, and encoded for the commitlog so that followers apply the same changes in the same
order (sessions, offsets, retained messages, declarations, pop state: what a promoted follower
must hold, not just the messages). A change record is a control record (holds/codec.py, op
META) whose body is the encoded batch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from rocksdict import WriteBatch

from ..errors import StoreError
from ..holds.codec import META

PUT, DELETE, DELETE_RANGE = 1, 2, 3
_OP = struct.Struct(">BII")  # op, length of the key (or range start), length of the value (or range end)
META_OP = bytes((META,))

Change = tuple[int, bytes, bytes]  # (op, key or range start, value or range end; b"" for a delete)


class MetaBatch:
    """Changes to apply together (all or none), in order."""

    __slots__ = ("changes",)

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def put(self, key: bytes, value: bytes) -> MetaBatch:
        self.changes.append((PUT, key, bytes(value)))
        return self

    def delete(self, key: bytes) -> MetaBatch:
        self.changes.append((DELETE, key, b""))
        return self

    def delete_range(self, start: bytes, end: bytes) -> MetaBatch:
        self.changes.append((DELETE_RANGE, start, end))
        return self

    def __len__(self) -> int:
        return len(self.changes)

    def write_batch(self) -> WriteBatch:
        batch = WriteBatch(raw_mode=True)
        for op, key, value in self.changes:
            if op == PUT:
                batch.put(key, value)
            elif op == DELETE:
                batch.delete(key)
            else:
                batch.delete_range(key, value)
        return batch

    def encode(self) -> bytes:
        """The control record's body: META, then each change."""
        return META_OP + b"".join(_OP.pack(op, len(key), len(value)) + key + value for op, key, value in self.changes)

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
        op, n_key, n_value = _OP.unpack_from(body, at)
        at += _OP.size
        if op not in (PUT, DELETE, DELETE_RANGE) or at + n_key + n_value > len(body):
            raise StoreError(f"bad meta change (op {op}) in a change record")
        yield op, body[at:at + n_key], body[at + n_key:at + n_key + n_value]
        at += n_key + n_value
