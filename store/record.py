"""Commitlog record codec (sans-IO): one stored message <-> bytes.

Layout (big-endian), framed like LevelDB/RocketMQ records so a torn write is detectable:

    0  total_size  u32   whole record, this field included
    4  magic       u32
    8  crc32       u32   CRC32 of bytes [12:total_size]
   12  flags       u32
   16  born_ts     i64   ms since the epoch, set by the producer side
   24  store_ts    i64   ms since the epoch, set by the store
   32  queue_count u16
   34  topic_len   u16
   36  key_len     u16
   38  props_len   u32
   42  body_len    u32
   46  topic | key | properties | queues | body

properties: repeated (u16 name_len, name, u32 value_len, value), UTF-8.
queues:     repeated (u16 name_len, name, u64 queue_offset): the queues the message is
            indexed into and its offset in each, so re-dispatch after a crash rebuilds
            exactly the offsets that were acknowledged.
"""

from __future__ import annotations

import struct
import zlib
from typing import Mapping, Sequence

from .errors import InvalidMessageError, RecordCorruptError

MAGIC = 0x7D1E_C0DE
MAGIC_BYTES = MAGIC.to_bytes(4, "big")
HEADER = struct.Struct(">IIIIqqHHHII")
HEADER_SIZE = HEADER.size  # 46
PREFIX = struct.Struct(">III")  # total_size, magic, crc
REST = struct.Struct(">IqqHHHII")
CRC_START = 12

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_QUEUE_TAIL = struct.Struct(">Q")
MAX_U16 = 0xFFFF


def encode_properties(properties: Mapping[str, str] | None) -> bytes:
    if not properties:
        return b""
    parts = []
    for name, value in properties.items():
        n = name.encode()
        v = value.encode()
        if len(n) > MAX_U16:
            raise InvalidMessageError(f"property name longer than {MAX_U16} bytes")
        parts.append(_U16.pack(len(n)))
        parts.append(n)
        parts.append(_U32.pack(len(v)))
        parts.append(v)
    return b"".join(parts)


def decode_properties(raw: bytes) -> dict[str, str]:
    props: dict[str, str] = {}
    i = 0
    end = len(raw)
    try:
        while i < end:
            (nlen,) = _U16.unpack_from(raw, i)
            i += 2
            name = raw[i : i + nlen].decode()
            i += nlen
            (vlen,) = _U32.unpack_from(raw, i)
            i += 4
            props[name] = raw[i : i + vlen].decode()
            i += vlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise RecordCorruptError(f"bad properties block: {exc}") from None
    if i != end:
        raise RecordCorruptError("properties block overruns its length")
    return props


def encode_queues(queues: Sequence[bytes], offsets: Sequence[int]) -> bytes:
    parts = []
    for name, offset in zip(queues, offsets):
        parts.append(_U16.pack(len(name)))
        parts.append(name)
        parts.append(_QUEUE_TAIL.pack(offset))
    return b"".join(parts)


def decode_queues(raw: bytes | memoryview, count: int) -> list[tuple[str, int]]:
    out = []
    i = 0
    for _ in range(count):
        (nlen,) = _U16.unpack_from(raw, i)
        i += 2
        name = bytes(raw[i : i + nlen]).decode()
        i += nlen
        (offset,) = _QUEUE_TAIL.unpack_from(raw, i)
        i += 8
        out.append((name, offset))
    return out


def encode_record(
    *,
    topic: bytes,
    key: bytes,
    properties: bytes,
    queues: bytes,
    queue_count: int,
    body: bytes,
    born_ts: int,
    store_ts: int,
    flags: int = 0,
) -> bytes:
    """Frame one record; ``queues`` is the output of :func:`encode_queues`."""
    if len(topic) > MAX_U16 or len(key) > MAX_U16 or queue_count > MAX_U16:
        raise InvalidMessageError("topic, key or queue list too long for a record")
    total = HEADER_SIZE + len(topic) + len(key) + len(properties) + len(queues) + len(body)
    rest = b"".join(
        (
            REST.pack(flags, born_ts, store_ts, queue_count, len(topic), len(key), len(properties), len(body)),
            topic,
            key,
            properties,
            queues,
            body,
        )
    )
    return PREFIX.pack(total, MAGIC, zlib.crc32(rest)) + rest


class RecordView:
    """The decoded fields of one record, sliced out of a buffer without copying the body twice."""

    __slots__ = (
        "size",
        "flags",
        "born_ts",
        "store_ts",
        "topic",
        "key",
        "raw_properties",
        "raw_queues",
        "queue_count",
        "body",
    )

    def __init__(self, buf: bytes | memoryview, pos: int = 0, *, verify: bool = True) -> None:
        if len(buf) - pos < HEADER_SIZE:
            raise RecordCorruptError("incomplete record header")
        total, magic, crc, flags, born, store, nq, lt, lk, lp, lb = HEADER.unpack_from(buf, pos)
        if magic != MAGIC:
            raise RecordCorruptError(f"bad magic {magic:#x}")
        if total < HEADER_SIZE + lt + lk + lp + lb + 10 * nq:
            raise RecordCorruptError("bad record size")
        end = pos + total
        if end > len(buf):
            raise RecordCorruptError("record runs past the end of the buffer")
        if verify and zlib.crc32(buf[pos + CRC_START : end]) != crc:
            raise RecordCorruptError("CRC mismatch")
        i = pos + HEADER_SIZE
        self.size = total
        self.flags = flags
        self.born_ts = born
        self.store_ts = store
        self.queue_count = nq
        try:
            self.topic = bytes(buf[i : i + lt]).decode()
            i += lt
            self.key = bytes(buf[i : i + lk]).decode()
        except UnicodeDecodeError:
            raise RecordCorruptError("topic or key is not UTF-8") from None
        i += lk
        self.raw_properties = bytes(buf[i : i + lp])
        i += lp
        qlen = end - lb - i
        if qlen < 0:
            raise RecordCorruptError("field lengths exceed the record size")
        self.raw_queues = bytes(buf[i : i + qlen])
        self.body = bytes(buf[end - lb : end])

    def queues(self) -> list[tuple[str, int]]:
        try:
            return decode_queues(self.raw_queues, self.queue_count)
        except (struct.error, UnicodeDecodeError) as exc:
            raise RecordCorruptError(f"bad queue list: {exc}") from None


def peek_size(buf: bytes | memoryview, pos: int = 0) -> int:
    """Return the total size field of the record at ``pos`` (no validation)."""
    return _U32.unpack_from(buf, pos)[0]
