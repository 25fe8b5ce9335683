"""What a read returns (``StoredMessage``): a record read back from the commitlog -- the content a
``Message`` had, as stored (properties and queues still encoded, the tags as their hash), the
place a ``PutResult`` reported, and the one queue and offset it was read through. Compiled: one
is built per message read, and the queue cache keeps thousands, so it is a C object without a
``__dict__``, not tracked by the cyclic garbage collector (it can be in no cycle)."""

from __future__ import annotations

import cython

from ..log.record import decode_properties, decode_queues


@cython.no_gc
@cython.cclass
class StoredMessage:
    """A message read back from the store, with its place in the commitlog and in the queue it
    was read from.

    Weakly referenceable, so that a reader can keep what it derives from a message (the MQTT
    gateway's encoded PUBLISH) beside it for exactly as long as the message lives."""

    _msg_id = cython.declare(object)  # str, or None: formatted from id_prefix and position when read
    id_prefix = cython.declare(str, visibility="readonly")
    position = cython.declare(object, visibility="public")
    size = cython.declare(object, visibility="public")
    topic = cython.declare(str, visibility="public")
    key = cython.declare(str, visibility="public")
    body = cython.declare(bytes, visibility="public")
    born_timestamp = cython.declare(object, visibility="public")
    store_timestamp = cython.declare(object, visibility="public")
    raw_properties = cython.declare(bytes, visibility="public")
    raw_queues = cython.declare(bytes, visibility="public")
    queue_count = cython.declare(object, visibility="public")
    queue = cython.declare(str, visibility="public")
    queue_offset = cython.declare(object, visibility="public")
    tag_hash = cython.declare(object, visibility="public")
    flag = cython.declare(object, visibility="public")
    _properties = cython.declare(dict, visibility="public")
    __weakref__ = cython.declare(object)

    def __init__(self, msg_id: str | None, position: int, size: int, topic: str, key: str, body: bytes,
                 born_timestamp: int, store_timestamp: int, raw_properties: bytes, raw_queues: bytes,
                 queue_count: int, queue: str = "", queue_offset: int = -1, tag_hash: int = 0, flag: int = 0,
                 _properties: dict | None = None, id_prefix: str = "") -> None:
        self._msg_id = msg_id
        self.id_prefix = id_prefix
        self.position = position
        self.size = size
        self.topic = topic
        self.key = key
        self.body = body
        self.born_timestamp = born_timestamp
        self.store_timestamp = store_timestamp
        self.raw_properties = raw_properties
        self.raw_queues = raw_queues
        self.queue_count = queue_count
        self.queue = queue
        self.queue_offset = queue_offset
        self.tag_hash = tag_hash
        self.flag = flag
        self._properties = _properties

    @property
    def msg_id(self) -> str:
        """RocketMQ's offsetMsgId: given, or the store's identity then the position (store/log/msgid.py),
        formatted when first read (most readers never read it)."""
        if self._msg_id is None:
            self._msg_id = f"{self.id_prefix}{self.position:016X}"
        return self._msg_id

    @property
    def properties(self) -> dict[str, str]:
        if self._properties is None:
            self._properties = decode_properties(self.raw_properties)
        return self._properties

    @property
    def queues(self) -> list[tuple[str, int]]:
        """Every (queue, offset) the message was indexed into."""
        return decode_queues(self.raw_queues, self.queue_count)

    def _fields(self) -> tuple:
        return (self.msg_id, self.position, self.size, self.topic, self.key, self.body, self.born_timestamp,
                self.store_timestamp, self.raw_properties, self.raw_queues, self.queue_count, self.queue,
                self.queue_offset, self.tag_hash, self.flag)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredMessage):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return (f"StoredMessage(msg_id={self.msg_id!r}, position={self.position!r}, topic={self.topic!r}, "
                f"queue={self.queue!r}, queue_offset={self.queue_offset!r}, size={self.size!r})")
