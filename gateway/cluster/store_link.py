# cython: annotation_typing=False
"""The store link, sans-IO: how a gateway node (``--role gateway``) uses the store of a store
node (``--role store``) over the RocketMQ remoting protocol.

Requests are ordinary remoting commands with private request codes (``StoreCode``, a range
RocketMQ does not use), so the store node serves them on its remoting port beside RocketMQ
clients, through the same frame codec. Small control requests carry their arguments in the
header's ext fields; the two hot paths carry binary bodies built here:

PUT request body, per message (big endian; strings UTF-8 with a u16 length, blobs u32):
    topic, key, tags, born ms (i64, -1: the store's clock), flag (u32), properties (blob, the
    store's encoding), queue count (u16) + queue names, body (blob)
    A queue named ``WILDCARD_TARGETS`` stands for "and every wildcard queue whose filter
    matches the topic": the store node holds the cluster's wildcard filters and expands it.
PUT response body, per message: position (u64), size (u32), store ms (i64), queue count (u16),
    then (queue name, offset i64) per queue the message was indexed into (none when the PUT's
    ext field ``offsets`` is ``0``: callers that only need positions)
GET response body, per message: position (u64), queue offset (i64), tag hash (i32), record
    (blob: the commitlog record as stored, decoded by the client with ``store.log.record``)

The commitlog record travels as it is stored, so the store node does no per-message encoding
and the gateway node decodes with the store's own reader. Notify events reach a subscribed
gateway node as one-way ``NOTIFY`` requests whose body is ``encode_offsets``.

The codec uses the store's data types (messages, results, the record reader) and nothing of
its I/O: the store knows nothing of this module.
"""

from __future__ import annotations

import enum
import struct

import cython
from collections.abc import Iterable, Sequence

from store import (
    GetResult,
    GetStatus,
    Message,
    PutResult,
    RecordCorruptError,
    StoredMessage,
)
from store import encode_properties as encode_store_properties
from store import RecordView

from protocols.remoting.errors import RemotingProtocolError


class StoreCode(enum.IntEnum):
    """Private request codes of the store link (RocketMQ's own stay below 1,000 and at 200,000+)."""

    HELLO = 30_100  # -> store identity (id prefix), limits
    PUT = 30_101
    GET = 30_102
    READ_AT = 30_103  # one message by commitlog position
    OFFSETS = 30_104  # min and max offsets of queues
    COMMIT_OFFSET = 30_105  # a consumer's offset of a queue (one-way)
    GET_OFFSET = 30_106
    KV_GET = 30_107
    KV_PUT = 30_108  # one-way
    KV_DELETE = 30_109  # one-way
    KV_ITEMS = 30_110
    SUBSCRIBE_NOTIFY = 30_111
    NOTIFY = 30_112  # store node -> gateway node, one-way: queues with new data
    FILTER_HOLD = 30_113  # a session subscribes to an MQTT wildcard filter (its queue gets writes)
    FILTER_RELEASE = 30_114
    RETAINED_SET = 30_115  # topic -> position of its retained message (-1: cleared)
    RETAINED_MATCH = 30_116  # the retained messages of the topics a filter matches
    INTEREST = 30_117  # one-way: a gateway node starts or stops reading a queue (notify routing)
    TAKEOVER = 30_118  # a client connected here: disconnect it on node N (or every other node)
    CLIENT_KICK = 30_119  # store node -> gateway node: disconnect a client, save its session, answer


WILDCARD_TARGETS = "\x00wildcards"  # (no queue of any protocol has this name)


class StoreLinkError(RemotingProtocolError):
    """A store-link body that does not decode."""


_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_MSG_HEAD = struct.Struct(">qIBQ")  # born, flag, hold kind, hold due (store.Message)
_MSG_HEAD_AND_PROPS = struct.Struct(">qIBQI")  # the same, then the properties' length
_NO_KEY_NO_TAGS = bytes(4)  # two empty strings
_PUT_RESULT = struct.Struct(">QIq")  # position, size, store ms
_I64 = struct.Struct(">q")
_GET_ENTRY = struct.Struct(">QqiI")  # position, queue offset, tag hash, record length


def _str(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"string of {len(raw)} bytes is too long for the store link")
    return _U16.pack(len(raw)) + raw


def _blob(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


@cython.cfunc
@cython.inline
@cython.locals(data=bytes, at=cython.Py_ssize_t)
@cython.returns(cython.Py_ssize_t)
@cython.exceptval(-1)
def _u16_at(data, at):
    """The big-endian u16 at ``at`` (IndexError past the end)."""
    return ((cython.cast(cython.Py_ssize_t, cython.cast(cython.uchar, data[at])) << 8)
            | cython.cast(cython.uchar, data[at + 1]))


@cython.cfunc
@cython.inline
@cython.locals(data=bytes, at=cython.Py_ssize_t)
@cython.returns(cython.Py_ssize_t)
@cython.exceptval(-1)
def _u32_at(data, at):
    """The big-endian u32 at ``at`` (IndexError past the end)."""
    return ((cython.cast(cython.Py_ssize_t, cython.cast(cython.uchar, data[at])) << 24)
            | (cython.cast(cython.Py_ssize_t, cython.cast(cython.uchar, data[at + 1])) << 16)
            | (cython.cast(cython.Py_ssize_t, cython.cast(cython.uchar, data[at + 2])) << 8)
            | cython.cast(cython.uchar, data[at + 3]))


class _Reader:
    __slots__ = ("at", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        end = self.at + n
        if end > len(self.data):
            raise StoreLinkError("store link body is truncated")
        chunk = self.data[self.at:end]
        self.at = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple:
        end = self.at + fmt.size
        if end > len(self.data):
            raise StoreLinkError("store link body is truncated")
        values = fmt.unpack_from(self.data, self.at)
        self.at = end
        return values

    def str(self) -> str:
        (n,) = self.unpack(_U16)
        try:
            return self.take(n).decode()
        except UnicodeDecodeError:
            raise StoreLinkError("store link string is not UTF-8") from None

    def blob(self) -> bytes:
        (n,) = self.unpack(_U32)
        return self.take(n)

    def done(self) -> bool:
        return self.at >= len(self.data)


# -- PUT ----------------------------------------------------------------------------------------
def encode_put(items: Iterable[tuple[Message, Sequence[str]]]) -> bytes:
    """A PUT body (layout above), built inline as ``decode_put`` reads it: the fixed fields
    between two variable ones packed together, and each topic and queue name encoded once a
    body (a fan-in's messages name the same few)."""
    u16, u32, head = _U16.pack, _U32.pack, _MSG_HEAD_AND_PROPS.pack
    out: list[bytes] = []
    append = out.append
    named: dict[str, bytes] = {}  # topic or queue name -> its length and UTF-8
    count = 0
    for message, queues in items:
        props = message.encoded_properties
        if props is None:
            props = encode_store_properties(message.properties) if message.properties else b""
        born = message.born_timestamp
        topic = named.get(message.topic)
        if topic is None:
            topic = named[message.topic] = _str(message.topic)
        key, tags = message.key, message.tags
        if key or tags:
            append(topic)
            append(_str(key or ""))
            append(_str(tags or ""))
        else:
            append(topic + _NO_KEY_NO_TAGS)
        append(head(born if born is not None else -1, message.flag, message.hold_kind, message.hold_due_ms,
                    len(props)))
        append(props)
        append(u16(len(queues)))
        for queue in queues:
            encoded = named.get(queue)
            if encoded is None:
                encoded = named[queue] = _str(queue)
            append(encoded)
        body = message.body
        append(u32(len(body)))
        append(body)
        count += 1
    return u32(count) + b"".join(out)


@cython.locals(data=bytes, at=cython.Py_ssize_t, n=cython.Py_ssize_t, size=cython.Py_ssize_t,
               count=cython.Py_ssize_t, queue_count=cython.Py_ssize_t, i=cython.Py_ssize_t, k=cython.Py_ssize_t)
def decode_put(data: bytes) -> list[tuple[Message, list[str]]]:
    """``encode_put``'s body back; StoreLinkError when it is not one. Parsed inline, with
    no call per field: a gateway node's fan-in sends hundreds of messages a PUT."""
    head = _MSG_HEAD.unpack_from
    head_size = _MSG_HEAD.size
    size = len(data)
    items = []
    at = 0
    try:
        count = _u32_at(data, 0)
        at = 4
        for i in range(count):
            n = _u16_at(data, at)
            topic = data[at + 2:at + 2 + n].decode()
            at += 2 + n
            n = _u16_at(data, at)
            key = data[at + 2:at + 2 + n].decode() if n else ""
            at += 2 + n
            n = _u16_at(data, at)
            tags = data[at + 2:at + 2 + n].decode() if n else ""
            at += 2 + n
            born, flag, hold_kind, hold_due = head(data, at)
            at += head_size
            n = _u32_at(data, at)
            props = data[at + 4:at + 4 + n]
            at += 4 + n
            queue_count = _u16_at(data, at)
            at += 2
            queues = []
            for k in range(queue_count):
                n = _u16_at(data, at)
                queues.append(data[at + 2:at + 2 + n].decode())
                at += 2 + n
            n = _u32_at(data, at)
            body = data[at + 4:at + 4 + n]
            at += 4 + n
            if at > size:
                raise StoreLinkError("store link body is truncated")
            items.append((Message(topic, body, None, key or None, tags or None, born if born >= 0 else None, props,
                                  flag, hold_kind, hold_due),
                          queues))
    except (struct.error, IndexError):
        raise StoreLinkError("store link body is truncated") from None
    except UnicodeDecodeError:
        raise StoreLinkError("store link string is not UTF-8") from None
    if at < size:
        raise StoreLinkError("store link PUT body has trailing bytes")
    return items


_NO_OFFSETS = _U16.pack(0)


def encode_put_results(results: Sequence[PutResult], queue_offsets: bool = True) -> bytes:
    """``queue_offsets`` False (a PUT that asked ``offsets=0``): each result with no queue offsets,
    which an MQTT gateway node never reads (the same layout: a queue count of 0). A queue name
    is encoded once a body (a put's messages mostly name the same queues). A put's own results
    (``places``) are encoded without being made."""
    places = getattr(results, "places", None)
    if places is not None:
        return _encode_places(places(), queue_offsets)
    return _encode_places([(r.position, r.size, r.store_timestamp, list(r.queue_offsets), list(r.queue_offsets.values()))
                           for r in results], queue_offsets)


def _encode_places(places: list[tuple[int, int, int, list[str], list[int]]], queue_offsets: bool) -> bytes:
    out = []
    pack_result = _PUT_RESULT.pack
    if not queue_offsets:
        for position, size, store_ts, _, _ in places:
            out.append(pack_result(position, size, store_ts))
            out.append(_NO_OFFSETS)
        return b"".join(out)
    names: dict[str, bytes] = {}
    pack_count, pack_offset = _U16.pack, _I64.pack
    for position, size, store_ts, queues, offsets in places:
        out.append(pack_result(position, size, store_ts))
        out.append(pack_count(len(queues)))
        for name, offset in zip(queues, offsets):
            encoded = names.get(name)
            if encoded is None:
                encoded = names[name] = _str(name)
            out.append(encoded)
            out.append(pack_offset(offset))
    return b"".join(out)


@cython.locals(data=bytes, at=cython.Py_ssize_t, n=cython.Py_ssize_t, size=cython.Py_ssize_t,
               length=cython.Py_ssize_t, head_size=cython.Py_ssize_t, k=cython.Py_ssize_t)
def decode_put_results(data: bytes, id_prefix: str) -> list[PutResult]:
    """``encode_put_results``' body back, parsed inline (a queue name decoded once a body)."""
    head, i64 = _PUT_RESULT.unpack_from, _I64.unpack_from
    head_size = _PUT_RESULT.size
    size = len(data)
    names: dict[bytes, str] = {}
    results = []
    at = 0
    try:
        while at < size:
            position, record_size, store_ms = head(data, at)
            n = _u16_at(data, at + head_size)
            at += head_size + 2
            offsets = {}
            for k in range(n):
                length = _u16_at(data, at)
                raw = data[at + 2:at + 2 + length]
                name = names.get(raw)
                if name is None:
                    name = names[raw] = raw.decode()
                at += 2 + length
                offsets[name] = i64(data, at)[0]
                at += 8
            results.append(PutResult(id_prefix, position, record_size, store_ms, offsets))
    except (struct.error, IndexError):
        raise StoreLinkError("store link body is truncated") from None
    except UnicodeDecodeError:
        raise StoreLinkError("store link string is not UTF-8") from None
    if at > size:
        raise StoreLinkError("store link body is truncated")
    return results


# -- GET ----------------------------------------------------------------------------------------
def get_fields(queue: str, offset: int, max_messages: int, max_bytes: int,
               tag_hashes: frozenset[int] | None) -> dict[str, str]:
    fields = {"queue": queue, "offset": str(offset), "max": str(max_messages), "maxBytes": str(max_bytes)}
    if tag_hashes is not None:
        fields["tags"] = ",".join(map(str, sorted(tag_hashes)))
    return fields


def result_fields(result: GetResult) -> dict[str, str]:
    return {"status": result.status.value, "next": str(result.next_offset), "min": str(result.min_offset),
            "max": str(result.max_offset)}


def encode_messages(messages: Iterable[StoredMessage], records: Iterable[bytes]) -> bytes:
    """``records``: each message's commitlog record, as stored."""
    out = []
    for message, record in zip(messages, records, strict=True):
        out.append(_GET_ENTRY.pack(message.position, message.queue_offset, message.tag_hash, len(record)))
        out.append(record)
    return b"".join(out)


def decode_messages(data: bytes, id_prefix: str, queue: str) -> list[StoredMessage]:
    reader = _Reader(data)
    messages = []
    while not reader.done():
        position, offset, tag, length = reader.unpack(_GET_ENTRY)
        start = reader.at
        reader.take(length)
        try:
            view = RecordView(data, start)
        except (RecordCorruptError, ValueError) as exc:
            raise StoreLinkError(f"store link record at {position} does not decode: {exc}") from None
        if view.size != length:
            raise StoreLinkError(f"store link record at {position} is not {length} bytes long")
        messages.append(StoredMessage(
            f"{id_prefix}{position:016X}", position, view.size, view.topic, view.key, view.body, view.born_ts,
            view.store_ts, view.raw_properties, view.raw_queues, view.queue_count, queue, offset, tag, view.flags))
    return messages


def decode_result(fields: dict[str, str], body: bytes, id_prefix: str, queue: str) -> GetResult:
    try:
        status = GetStatus(fields["status"])
        next_offset, low, high = int(fields["next"]), int(fields["min"]), int(fields["max"])
    except (KeyError, ValueError):
        raise StoreLinkError("store link GET response lacks its status fields") from None
    return GetResult(status, decode_messages(body, id_prefix, queue), next_offset, low, high)


# -- offsets and notify -------------------------------------------------------------------------
def encode_offsets(offsets: dict[str, int]) -> bytes:
    """queue -> offset pairs (notify events, OFFSETS answers)."""
    return b"".join(_str(queue) + _I64.pack(offset) for queue, offset in offsets.items())


def decode_offsets(data: bytes) -> dict[str, int]:
    reader = _Reader(data)
    offsets = {}
    while not reader.done():
        queue = reader.str()
        offsets[queue] = reader.unpack(_I64)[0]
    return offsets


def encode_names(names: Iterable[str]) -> bytes:
    return b"".join(_str(name) for name in names)


def decode_names(data: bytes) -> list[str]:
    reader = _Reader(data)
    names = []
    while not reader.done():
        names.append(reader.str())
    return names


def encode_items(items: Iterable[tuple[str, bytes]]) -> bytes:
    """KV pairs (KV_ITEMS answers)."""
    return b"".join(_str(key) + _blob(value) for key, value in items)


def decode_items(data: bytes) -> list[tuple[str, bytes]]:
    reader = _Reader(data)
    items = []
    while not reader.done():
        key = reader.str()
        items.append((key, reader.blob()))
    return items
