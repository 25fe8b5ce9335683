"""What a put returns (``PutResult``): the receipt of a stored message -- where its record went,
not what it holds (a ``StoredMessage`` is what a read gives back). Compiled with the committer's
bookkeeping: one is built per message stored, so it is a C object whose message id is formatted
when it is read (most callers never read it: the gateways acknowledge by position or not at all)."""

from __future__ import annotations

import cython


@cython.no_gc  # not tracked by the cyclic GC, one per message (a dict of queue names to ints: it can be in no cycle)
@cython.cclass
class PutResult:
    """A stored message's place: commitlog ``position`` and record ``size``, the store's time
    and, per queue, the offset it was given there (``queue_offsets``)."""

    id_prefix = cython.declare(str, visibility="readonly")  # the store's half of the message id
    position = cython.declare(object, visibility="readonly")  # commitlog position of the record
    size = cython.declare(object, visibility="readonly")  # record size in bytes
    store_timestamp = cython.declare(object, visibility="readonly")
    queue_offsets = cython.declare(dict, visibility="readonly")  # queue name -> offset given in it

    def __init__(self, id_prefix: str, position: int, size: int, store_timestamp: int,
                 queue_offsets: dict[str, int]) -> None:
        self.id_prefix = id_prefix
        self.position = position
        self.size = size
        self.store_timestamp = store_timestamp
        self.queue_offsets = queue_offsets

    @property
    def msg_id(self) -> str:
        """RocketMQ's offsetMsgId: the store's identity, then the position (store/log/msgid.py)."""
        return f"{self.id_prefix}{self.position:016X}"

    def _fields(self) -> tuple:
        return (self.id_prefix, self.position, self.size, self.store_timestamp, self.queue_offsets)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PutResult):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable contents, as the dataclass it replaces

    def __repr__(self) -> str:
        return (f"PutResult(msg_id={self.msg_id!r}, position={self.position!r}, size={self.size!r}, "
                f"store_timestamp={self.store_timestamp!r}, queue_offsets={self.queue_offsets!r})")
