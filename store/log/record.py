# distutils: libraries = z
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

On the compiled message path (pyproject.toml, ``[tool.tidemq] compiled``): the layout is written
once, in the functions below; only the small byte primitives under "Buffer primitives" have a C
body (``if cython.compiled``: a bytes object filled in place, zlib's crc32 over it) beside the
interpreted one (a bytearray, ``int.to_bytes``), as no pure-Python construct compiles to a memcpy.
The first line links zlib (``store/log/zlib_crc.pxd`` declares its crc32; Cython reads the
``# distutils:`` comment only before the docstring).
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Mapping, Sequence

import cython

from ..errors import InvalidMessageError, RecordCorruptError

if cython.compiled:
    from cython.cimports.cpython.bytes import PyBytes_AS_STRING, PyBytes_FromStringAndSize
    from cython.cimports.cpython.unicode import PyUnicode_AsUTF8AndSize
    from cython.cimports.libc.string import memcpy
    from cython.cimports.store.log.zlib_crc import crc32 as c_crc32

MAGIC = 0x7D1E_C0DE
MAGIC_BYTES = MAGIC.to_bytes(4, "big")
HEADER = struct.Struct(">IIIIqqHHHII")  # the layout above (the Arrow export reads it as a dtype)
HEADER_SIZE = HEADER.size  # 46
STATIC_HEAD = 14  # queue_count .. body_len: the head of encode_static()
FIXED_SIZE = HEADER_SIZE - STATIC_HEAD  # record bytes besides encode_static(), queue slots and body
QUEUE_SLOT_OVERHEAD = 2 + 8  # name length and offset around each queue name
CRC_START = 12

_U32 = struct.Struct(">I")
MAX_U16 = 0xFFFF
MAX_U32 = 0xFFFF_FFFF
# What the encoders take (an annotation of ``bytes`` alone would make the compiled build refuse
# the others): any bytes-like object, copied to bytes when it is not one.
BytesLike = bytes | bytearray | memoryview


# -- Buffer primitives: the only code with a compiled and an interpreted body ----------------


@cython.cfunc
@cython.inline
def _new(size: cython.Py_ssize_t) -> object:
    """A buffer of ``size`` bytes to fill: a bytes object written in place before anyone else
    sees it (compiled), a bytearray (interpreted); :func:`_finish` makes it the record."""
    if cython.compiled:
        return PyBytes_FromStringAndSize(cython.NULL, size)
    return bytearray(size)


@cython.cfunc
@cython.inline
def _finish(out: object) -> bytes:
    if cython.compiled:
        return out
    return bytes(out)


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
@cython.locals(p=cython.p_uchar)
def _put_uint(out: object, at: cython.Py_ssize_t, value: cython.ulonglong, n: cython.int) -> cython.void:
    """Write ``value`` big-endian in ``n`` bytes at ``at`` (the caller sized ``out`` for it and
    checked the value's range)."""
    if cython.compiled:
        p = cython.cast(cython.p_uchar, PyBytes_AS_STRING(out)) + at
        while n:
            n -= 1
            p[n] = value & 0xFF
            value >>= 8
    else:
        out[at : at + n] = value.to_bytes(n, "big")


@cython.cfunc
@cython.inline
def _put_bytes(out: object, at: cython.Py_ssize_t, src: bytes) -> cython.Py_ssize_t:
    """Copy ``src`` to ``at`` (the caller sized ``out`` for it); the position after it."""
    n: cython.Py_ssize_t = len(src)
    if cython.compiled:
        memcpy(PyBytes_AS_STRING(out) + at, PyBytes_AS_STRING(src), n)
    else:
        out[at : at + n] = src
    return at + n


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
@cython.locals(p=cython.p_uchar, value=cython.ulonglong)
def _get_uint(data: bytes, at: cython.Py_ssize_t, n: cython.int) -> cython.ulonglong:
    """The big-endian unsigned integer of ``n`` bytes at ``at`` (the caller checked the bounds)."""
    if cython.compiled:
        p = cython.cast(cython.p_uchar, PyBytes_AS_STRING(data)) + at
        value = 0
        while n:
            value = (value << 8) | p[0]
            p += 1
            n -= 1
        return value
    return int.from_bytes(data[at : at + n], "big")


@cython.cfunc
@cython.inline
def _crc(data: object, start: cython.Py_ssize_t, end: cython.Py_ssize_t) -> cython.uint:
    """CRC32 of ``data[start:end]``, without copying it (a record is at most 4 GiB)."""
    if cython.compiled:
        return c_crc32(0, cython.cast(cython.p_uchar, PyBytes_AS_STRING(data)) + start,
                       cython.cast(cython.uint, end - start))
    return zlib.crc32(memoryview(data)[start:end])


@cython.cfunc
@cython.locals(n=cython.Py_ssize_t, src=cython.p_const_char, out=object)
def _length_prefixed(text: str) -> bytes:
    """``text`` in UTF-8 after its length (u16; the caller checks the length, from the result's
    size). Compiled, the UTF-8 is read where the string keeps it (in place for ASCII) rather
    than encoded to a bytes object first."""
    if cython.compiled:
        src = PyUnicode_AsUTF8AndSize(text, cython.address(n))
        out = PyBytes_FromStringAndSize(cython.NULL, 2 + n)
        _put_uint(out, 0, n, 2)
        memcpy(PyBytes_AS_STRING(out) + 2, src, n)
        return out
    encoded = text.encode()
    return (len(encoded) & MAX_U16).to_bytes(2, "big") + encoded


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _put_int64(out: object, at: cython.Py_ssize_t, value: cython.longlong) -> cython.void:
    if cython.compiled:
        _put_uint(out, at, cython.cast(cython.ulonglong, value), 8)  # two's complement
    else:
        out[at : at + 8] = value.to_bytes(8, "big", signed=True)


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _get_int64(data: bytes, at: cython.Py_ssize_t) -> cython.longlong:
    if cython.compiled:
        return cython.cast(cython.longlong, _get_uint(data, at, 8))
    return int.from_bytes(data[at : at + 8], "big", signed=True)


# -- Helpers built on them ---------------------------------------------------------------------


@cython.cfunc
@cython.inline
def _as_bytes(value: object) -> bytes:
    return value if type(value) is bytes else bytes(value)




# -- Properties and queue lists ----------------------------------------------------------------


@cython.locals(size=cython.Py_ssize_t, at=cython.Py_ssize_t, i=cython.Py_ssize_t, n=bytes, v=bytes)
def encode_properties(properties: Mapping[str, str] | None) -> bytes:
    if not properties:
        return b""
    encoded = []
    size = 0
    for name, value in properties.items():
        n = name.encode()
        v = value.encode()
        if len(n) > MAX_U16:
            raise InvalidMessageError(f"property name longer than {MAX_U16} bytes")
        if len(v) > MAX_U32:
            raise InvalidMessageError(f"property value longer than {MAX_U32} bytes")
        encoded.append(n)
        encoded.append(v)
        size += 6 + len(n) + len(v)
    out = _new(size)
    at = 0
    for i in range(0, len(encoded), 2):
        n = encoded[i]
        v = encoded[i + 1]
        _put_uint(out, at, len(n), 2)
        at = _put_bytes(out, at + 2, n)
        _put_uint(out, at, len(v), 4)
        at = _put_bytes(out, at + 4, v)
    return _finish(out)


@cython.locals(data=bytes, i=cython.Py_ssize_t, end=cython.Py_ssize_t, nlen=cython.Py_ssize_t,
               vlen=cython.Py_ssize_t)
def decode_properties(raw: bytes | memoryview) -> dict[str, str]:
    data = _as_bytes(raw)
    props: dict[str, str] = {}
    i = 0
    end = len(data)
    try:
        while i < end:
            if end - i < 2:
                raise RecordCorruptError(f"bad properties block: a name length is cut off at byte {i}")
            nlen = _get_uint(data, i, 2)
            i += 2
            if end - i < nlen + 4:
                raise RecordCorruptError(f"bad properties block: a name or value length is cut off at byte {i}")
            name = data[i : i + nlen].decode()
            i += nlen
            vlen = _get_uint(data, i, 4)
            i += 4
            if end - i < vlen:
                raise RecordCorruptError("properties block overruns its length")
            props[name] = data[i : i + vlen].decode()
            i += vlen
    except UnicodeDecodeError as exc:
        raise RecordCorruptError(f"bad properties block: {exc}") from None
    return props


def queue_slots(queues: Sequence[bytes]) -> list[bytes]:
    """The fixed head (length + name) of each queue slot; the offset follows when it is known."""
    if len(queues) == 1:
        return [len(queues[0]).to_bytes(2, "big") + queues[0]]
    return [len(name).to_bytes(2, "big") + name for name in queues]


MAX_QUEUE_NAME_BYTES = 4096


@cython.locals(n=cython.Py_ssize_t, total=cython.Py_ssize_t, slot=bytes)
def queue_slots_of(queues: Sequence[str]) -> tuple[list[bytes], int]:
    """The slot heads of ``queues`` (see :func:`queue_slots`) and the bytes their slots take with
    the offsets. Built afresh each time: a cache of them (by name) cost more than it saved once
    the names were many (1,000,000 random queues: 2.0 us per message in its misses, inserts and
    clears, against ~0.1 us to build a slot)."""
    slots = []
    total = 0
    for q in queues:
        slot = _length_prefixed(q)
        n = len(slot) - 2
        if n == 0 or n > MAX_QUEUE_NAME_BYTES:
            raise InvalidMessageError(f"queue names are 1..{MAX_QUEUE_NAME_BYTES} bytes of UTF-8")
        slots.append(slot)
        total += n + QUEUE_SLOT_OVERHEAD
    return slots, total


@cython.locals(data=bytes, i=cython.Py_ssize_t, end=cython.Py_ssize_t, nlen=cython.Py_ssize_t, k=cython.Py_ssize_t)
def decode_queues(raw: bytes | memoryview, count: cython.Py_ssize_t) -> list[tuple[str, int]]:
    data = _as_bytes(raw)
    out = []
    i = 0
    end = len(data)
    try:
        for k in range(count):
            if end - i < 2:
                raise RecordCorruptError(f"bad queue list: a name length is cut off at byte {i}")
            nlen = _get_uint(data, i, 2)
            i += 2
            if end - i < nlen + 8:
                raise RecordCorruptError(f"bad queue list: a queue name or offset is cut off at byte {i}")
            name = data[i : i + nlen].decode()
            i += nlen
            out.append((name, _get_uint(data, i, 8)))
            i += 8
    except UnicodeDecodeError as exc:
        raise RecordCorruptError(f"bad queue list: {exc}") from None
    return out


def encode_queues(pairs: Sequence[tuple[str, int]]) -> bytes:
    """A record's queue list, as :func:`decode_queues` reads it: each name (u16 length, UTF-8)
    then its offset (u64), big-endian."""
    out = []
    for name, offset in pairs:
        out.append(_length_prefixed(name))
        out.append(offset.to_bytes(8, "big"))
    return b"".join(out)


# -- Records -----------------------------------------------------------------------------------


@cython.locals(lt=cython.Py_ssize_t, lk=cython.Py_ssize_t, lp=cython.Py_ssize_t, at=cython.Py_ssize_t)
def encode_static(topic: BytesLike, key: BytesLike, properties: BytesLike, queue_count: int, body_len: int) -> bytes:
    """The record's field lengths, topic, key and properties: all that is fixed before the
    store gives the message its queue offsets and store time."""
    topic, key, properties = _as_bytes(topic), _as_bytes(key), _as_bytes(properties)
    lt, lk, lp = len(topic), len(key), len(properties)
    if lt > MAX_U16 or lk > MAX_U16 or not 0 <= queue_count <= MAX_U16:
        raise InvalidMessageError("topic, key or queue list too long for a record")
    if lp > MAX_U32 or not 0 <= body_len <= MAX_U32:
        raise InvalidMessageError("properties or body too long for a record")
    out = _new(STATIC_HEAD + lt + lk + lp)
    _put_uint(out, 0, queue_count, 2)
    _put_uint(out, 2, lt, 2)
    _put_uint(out, 4, lk, 2)
    _put_uint(out, 6, lp, 4)
    _put_uint(out, 10, body_len, 4)
    at = _put_bytes(out, STATIC_HEAD, topic)
    at = _put_bytes(out, at, key)
    _put_bytes(out, at, properties)
    return _finish(out)


@cython.locals(n=cython.Py_ssize_t, i=cython.Py_ssize_t, at=cython.Py_ssize_t, need=cython.Py_ssize_t, slot=bytes)
def assemble(
    size: cython.Py_ssize_t, static: BytesLike, slots: Sequence[bytes], offsets: Sequence[int], body: BytesLike,
    born_ts: cython.longlong, store_ts: cython.longlong, flags: cython.uint = 0,
) -> bytes:
    """Frame a record from :func:`encode_static` output, queue slots and offsets (hot path)."""
    static, body = _as_bytes(static), _as_bytes(body)
    n = len(slots)
    if len(offsets) != n:
        raise ValueError(f"{n} queue slots but {len(offsets)} offsets")
    need = FIXED_SIZE + len(static) + len(body) + 8 * n
    for i in range(n):
        slot = slots[i]
        need += len(slot)
    if need != size or size > MAX_U32:  # the buffer is filled in place: its size must be exact
        raise ValueError(f"record size {size} does not match its fields ({need} bytes)")
    out = _new(size)
    _put_uint(out, 0, size, 4)
    _put_uint(out, 4, MAGIC, 4)
    _put_uint(out, 12, flags, 4)
    _put_int64(out, 16, born_ts)
    _put_int64(out, 24, store_ts)
    at = _put_bytes(out, 32, static)
    for i in range(n):
        at = _put_bytes(out, at, slots[i])
        _put_uint(out, at, offsets[i], 8)
        at += 8
    _put_bytes(out, at, body)
    _put_uint(out, 8, _crc(out, CRC_START, size), 4)
    return _finish(out)


def record_size(static: BytesLike, slots: Sequence[bytes], body_len: int) -> int:
    return FIXED_SIZE + len(static) + sum(len(s) for s in slots) + 8 * len(slots) + body_len


def encode_record(
    *,
    topic: BytesLike,
    key: BytesLike,
    properties: BytesLike,
    queues: Sequence[bytes],
    offsets: Sequence[int],
    body: BytesLike,
    born_ts: int,
    store_ts: int,
    flags: int = 0,
) -> bytes:
    """Frame one record in one call (tests, tools); the store uses the split form above."""
    static = encode_static(topic, key, properties, len(queues), len(body))
    slots = queue_slots(queues)
    return assemble(record_size(static, slots, len(body)), static, slots, offsets, body, born_ts, store_ts, flags)


@cython.cclass
class RecordView:
    """The decoded fields of one record, sliced out of a buffer without copying the body twice."""

    size = cython.declare(cython.Py_ssize_t, visibility="public")
    flags = cython.declare(cython.uint, visibility="public")
    born_ts = cython.declare(cython.longlong, visibility="public")
    store_ts = cython.declare(cython.longlong, visibility="public")
    queue_count = cython.declare(cython.Py_ssize_t, visibility="public")
    topic = cython.declare(str, visibility="public")
    key = cython.declare(str, visibility="public")
    raw_properties = cython.declare(bytes, visibility="public")
    raw_queues = cython.declare(bytes, visibility="public")
    body = cython.declare(bytes, visibility="public")

    @cython.locals(data=bytes, at=cython.Py_ssize_t, total=cython.Py_ssize_t, magic=cython.uint, crc=cython.uint,
                   lt=cython.Py_ssize_t, lk=cython.Py_ssize_t, lp=cython.Py_ssize_t, lb=cython.Py_ssize_t,
                   end=cython.Py_ssize_t, i=cython.Py_ssize_t, qlen=cython.Py_ssize_t)
    def __init__(self, buf: bytes | mmap.mmap, pos: cython.Py_ssize_t = 0, *, verify: cython.bint = True) -> None:
        if pos < 0 or len(buf) - pos < HEADER_SIZE:
            raise RecordCorruptError("incomplete record header")
        # The fields are read from a bytes object: the buffer itself, or (a segment's map) a copy
        # of the header, then of the record once its size is known.
        if type(buf) is bytes:
            data, at = buf, pos
        else:
            data, at = bytes(buf[pos : pos + HEADER_SIZE]), 0
        total = _get_uint(data, at, 4)
        magic = _get_uint(data, at + 4, 4)
        if magic != MAGIC:
            raise RecordCorruptError(f"bad magic {magic:#x}")
        crc = _get_uint(data, at + 8, 4)
        self.flags = _get_uint(data, at + 12, 4)
        self.born_ts = _get_int64(data, at + 16)
        self.store_ts = _get_int64(data, at + 24)
        self.queue_count = _get_uint(data, at + 32, 2)
        lt = _get_uint(data, at + 34, 2)
        lk = _get_uint(data, at + 36, 2)
        lp = _get_uint(data, at + 38, 4)
        lb = _get_uint(data, at + 42, 4)
        if total < HEADER_SIZE + lt + lk + lp + lb + QUEUE_SLOT_OVERHEAD * self.queue_count:
            raise RecordCorruptError("bad record size")
        if pos + total > len(buf):
            raise RecordCorruptError("record runs past the end of the buffer")
        if type(buf) is not bytes:
            data, at = bytes(buf[pos : pos + total]), 0
        end = at + total
        if verify and _crc(data, at + CRC_START, end) != crc:
            raise RecordCorruptError("CRC mismatch")
        i = at + HEADER_SIZE
        self.size = total
        try:
            self.topic = data[i : i + lt].decode()
            i += lt
            self.key = data[i : i + lk].decode() if lk else ""
        except UnicodeDecodeError:
            raise RecordCorruptError("topic or key is not UTF-8") from None
        i += lk
        self.raw_properties = data[i : i + lp]
        i += lp
        qlen = end - lb - i
        if qlen < 0:
            raise RecordCorruptError("field lengths exceed the record size")
        self.raw_queues = data[i : i + qlen]
        self.body = data[end - lb : end]

    def queues(self) -> list[tuple[str, int]]:
        return decode_queues(self.raw_queues, self.queue_count)


def peek_size(buf: bytes | memoryview, pos: int = 0) -> int:
    """Return the total size field of the record at ``pos`` (no validation)."""
    return _U32.unpack_from(buf, pos)[0]
