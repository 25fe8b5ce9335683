"""What a producer hands in (``Message``): a message's content before the store gives it a place
(a ``PutResult`` says where it went, a ``StoredMessage`` is what reads give back). Compiled: every
gateway builds one per message it stores, so it is a C object without a ``__dict__``, not tracked
by the cyclic garbage collector (it refers to strings, bytes, ints and a dict of strings: it can
be in no cycle). It behaves as a dataclass: keyword or positional fields, equality by fields."""

from __future__ import annotations

from collections.abc import Mapping

import cython


@cython.no_gc
@cython.cclass
class Message:
    """A message to store. ``tags`` only feeds the tag hash of its consume-queue entries.

    ``born_timestamp``: ms, the store's clock when None. ``encoded_properties``: ``properties``
    already encoded (store.encode_properties), for a gateway that sends the same set with many
    messages; used instead of ``properties`` when given. ``flag``: a u32 the store keeps for the
    application (RocketMQ's Message.flag). ``hold_kind``: a held message (store/holds/held_messages.py) is in
    no queue until released -- a timer message (holds.TIMER) at ``hold_due_ms``, a
    transaction's half message (holds.HALF; its first check then); 0: an ordinary message,
    indexed at once. The fields are not type-checked here: the store checks them when it takes
    the message (an ``InvalidMessageError``), as it did the dataclass's."""

    topic = cython.declare(object, visibility="public")
    body = cython.declare(object, visibility="public")
    properties = cython.declare(object, visibility="public")
    key = cython.declare(object, visibility="public")
    tags = cython.declare(object, visibility="public")
    born_timestamp = cython.declare(object, visibility="public")
    encoded_properties = cython.declare(object, visibility="public")
    flag = cython.declare(object, visibility="public")
    hold_kind = cython.declare(object, visibility="public")
    hold_due_ms = cython.declare(object, visibility="public")

    @cython.annotation_typing(False)  # (the annotations document; the store checks, as before)
    def __init__(self, topic: str, body: bytes, properties: Mapping[str, str] | None = None, key: str | None = None,
                 tags: str | None = None, born_timestamp: int | None = None, encoded_properties: bytes | None = None,
                 flag: int = 0, hold_kind: int = 0, hold_due_ms: int = 0) -> None:
        self.topic = topic
        self.body = body
        self.properties = properties
        self.key = key
        self.tags = tags
        self.born_timestamp = born_timestamp
        self.encoded_properties = encoded_properties
        self.flag = flag
        self.hold_kind = hold_kind
        self.hold_due_ms = hold_due_ms

    def _fields(self) -> tuple:
        return (self.topic, self.body, self.properties, self.key, self.tags, self.born_timestamp,
                self.encoded_properties, self.flag, self.hold_kind, self.hold_due_ms)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return (f"Message(topic={self.topic!r}, body={self.body!r}, properties={self.properties!r}, "
                f"key={self.key!r}, tags={self.tags!r}, born_timestamp={self.born_timestamp!r}, "
                f"encoded_properties={self.encoded_properties!r}, flag={self.flag!r}, "
                f"hold_kind={self.hold_kind!r}, hold_due_ms={self.hold_due_ms!r})")
