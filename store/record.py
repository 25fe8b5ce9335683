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

import mmap
import struct
import zlib
from typing import Mapping, Sequence

from .errors import InvalidMessageError, RecordCorruptError

MAGIC = 0x7D1E_C0DE
MAGIC_BYTES = MAGIC.to_bytes(4, "big")
HEADER = struct.Struct(">IIIIqqHHHII")
HEADER_SIZE = HEADER.size  # 46
PREFIX = struct.Struct(">III")  # total_size, magic, crc
TIMES = struct.Struct(">Iqq")  # flags, born_ts, store_ts
LENGTHS = struct.Struct(">HHHII")  # queue_count, topic_len, key_len, props_len, body_len
FIXED_SIZE = PREFIX.size + TIMES.size  # record bytes besides encode_static(), queue slots and body
QUEUE_SLOT_OVERHEAD = 2 + 8  # name length and offset around each queue name
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


def queue_slots(queues: Sequence[bytes]) -> list[bytes]:
    """The fixed head (length + name) of each queue slot; the offset follows when it is known."""
    if len(queues) == 1:
        return [len(queues[0]).to_bytes(2, "big") + queues[0]]
    return [_U16.pack(len(name)) + name for name in queues]


MAX_QUEUE_NAME_BYTES = 4096

# queue (one name) or queue list -> (slot heads, encoded length of the slots): gateways send the
# same few lists over and over
_SLOTS: dict[str | tuple[str, ...], tuple[list[bytes], int]] = {}
_SLOTS_ENTRIES = 65_536


def queue_slots_of(queues: Sequence[str]) -> tuple[list[bytes], int]:
    """The slot heads of ``queues`` (see :func:`queue_slots`) and the bytes their slots take with
    the offsets; remembered for the lists a store sees again and again."""
    key = queues[0] if len(queues) == 1 else tuple(queues)
    known = _SLOTS.get(key)
    if known is None:
        names = [q.encode() for q in queues]
        for name in names:
            if not name or len(name) > MAX_QUEUE_NAME_BYTES:
                raise InvalidMessageError(f"queue names are 1..{MAX_QUEUE_NAME_BYTES} bytes of UTF-8")
        known = _SLOTS[key] = (queue_slots(names), sum(map(len, names)) + QUEUE_SLOT_OVERHEAD * len(names))
        if len(_SLOTS) > _SLOTS_ENTRIES:
            _SLOTS.clear()
    return known


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


def encode_static(topic: bytes, key: bytes, properties: bytes, queue_count: int, body_len: int) -> bytes:
    """The record's field lengths, topic, key and properties: all that is fixed before the
    store gives the message its queue offsets and store time."""
    if len(topic) > MAX_U16 or len(key) > MAX_U16 or queue_count > MAX_U16:
        raise InvalidMessageError("topic, key or queue list too long for a record")
    return LENGTHS.pack(queue_count, len(topic), len(key), len(properties), body_len) + topic + key + properties


def assemble(
    size: int, static: bytes, slots: Sequence[bytes], offsets: Sequence[int], body: bytes,
    born_ts: int, store_ts: int, flags: int = 0,
) -> bytes:
    """Frame a record from :func:`encode_static` output, queue slots and offsets (hot path)."""
    if len(slots) == 1:
        queues = slots[0] + _QUEUE_TAIL.pack(offsets[0])
    else:
        queues = b"".join([slot + _QUEUE_TAIL.pack(o) for slot, o in zip(slots, offsets)])
    rest = b"".join((TIMES.pack(flags, born_ts, store_ts), static, queues, body))
    return PREFIX.pack(size, MAGIC, zlib.crc32(rest)) + rest


def record_size(static: bytes, slots: Sequence[bytes], body_len: int) -> int:
    return FIXED_SIZE + len(static) + sum(len(s) for s in slots) + 8 * len(slots) + body_len


def encode_record(
    *,
    topic: bytes,
    key: bytes,
    properties: bytes,
    queues: Sequence[bytes],
    offsets: Sequence[int],
    body: bytes,
    born_ts: int,
    store_ts: int,
    flags: int = 0,
) -> bytes:
    """Frame one record in one call (tests, tools); the store uses the split form above."""
    static = encode_static(topic, key, properties, len(queues), len(body))
    slots = queue_slots(queues)
    return assemble(record_size(static, slots, len(body)), static, slots, offsets, body, born_ts, store_ts, flags)


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

    def __init__(self, buf: bytes | mmap.mmap, pos: int = 0, *, verify: bool = True) -> None:
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
            self.topic = buf[i : i + lt].decode()
            i += lt
            self.key = buf[i : i + lk].decode() if lk else ""
        except UnicodeDecodeError:
            raise RecordCorruptError("topic or key is not UTF-8") from None
        i += lk
        self.raw_properties = buf[i : i + lp]
        i += lp
        qlen = end - lb - i
        if qlen < 0:
            raise RecordCorruptError("field lengths exceed the record size")
        self.raw_queues = buf[i : i + qlen]
        self.body = buf[end - lb : end]

    def queues(self) -> list[tuple[str, int]]:
        try:
            return decode_queues(self.raw_queues, self.queue_count)
        except (struct.error, UnicodeDecodeError) as exc:
            raise RecordCorruptError(f"bad queue list: {exc}") from None


def peek_size(buf: bytes | memoryview, pos: int = 0) -> int:
    """Return the total size field of the record at ``pos`` (no validation)."""
    return _U32.unpack_from(buf, pos)[0]
