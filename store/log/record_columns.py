"""Fields of many commitlog records at once, as Arrow-layout buffers (sans-IO): the bulk readers'
decoder (``store/read/columns.py`` turns its output into Arrow arrays without a copy).

``cut`` walks the records of a batch once: it checks each one's frame (size as the index says,
magic, field lengths within the record, the record within the buffer) and copies the fields
asked for into one data buffer per field, with int32 offsets (Arrow's string/binary layout),
the born timestamps into an int64 array. A record that does not check out is a
``RecordCorruptError`` naming its queue and offset, never a read past the buffer. Given the
topic every record should have (a topic queue's), it compares each record's topic with it and
builds no topic column when all match. On the compiled path (pyproject.toml ``[tool.tidemq]
compiled``) a record costs a few loads and a memcpy: ~80 ns over 1,000 interleaved queues,
nearly all of it the cache miss of reaching the record, so the numpy gathers it replaced were
no slower in all; what it adds is the checks (field lengths, the topic byte by byte) in the
same pass. Interpreted it is a Python loop per record: the reference for the tests only.
"""

from __future__ import annotations

import cython
import numpy as np

from ..errors import RecordCorruptError
from .record import HEADER_SIZE, MAGIC

if cython.compiled:
    from cython.cimports.libc.string import memcpy

TOPIC, KEY, PROPERTIES, PAYLOAD, BORN = 1, 2, 4, 8, 16  # the fields ``cut`` is asked for (bits)
_MAX_COLUMN = (1 << 31) - 1  # an int32-offset column holds at most this many bytes


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _W(byte: cython.uchar) -> cython.Py_ssize_t:
    """A byte widened before it is shifted into a u32 (a C int would overflow)."""
    return byte


@cython.cfunc
@cython.boundscheck(False)
@cython.wraparound(False)
def _copy(out: cython.uchar[::1], buf: cython.const[cython.uchar][::1], starts: cython.const[cython.longlong][::1],
          offsets: cython.int[::1], n: cython.Py_ssize_t) -> cython.void:
    """Field ``i`` is ``buf[starts[i]:starts[i] + offsets[i + 1] - offsets[i]]``: copied to
    ``out`` at ``offsets[i]`` (every span checked by the caller)."""
    i: cython.Py_ssize_t
    size: cython.Py_ssize_t
    for i in range(n):
        size = offsets[i + 1] - offsets[i]
        if size == 0:
            continue
        if cython.compiled:  # (a memoryview slice assignment costs a call with shape checks)
            memcpy(cython.address(out[offsets[i]]), cython.address(buf[starts[i]]), size)
        else:
            out[offsets[i]:offsets[i + 1]] = buf[starts[i]:starts[i] + size]


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, p=cython.Py_ssize_t, total=cython.Py_ssize_t,
               magic=cython.Py_ssize_t, stamp=cython.ulonglong, lt=cython.Py_ssize_t,
               lk=cython.Py_ssize_t, lp=cython.Py_ssize_t, lb=cython.Py_ssize_t, end=cython.Py_ssize_t,
               size=cython.Py_ssize_t, k=cython.int, length=cython.Py_ssize_t, n_topic=cython.Py_ssize_t,
               same_topic=cython.bint, have_topic=cython.bint)
def cut(buf: cython.const[cython.uchar][::1], rel: cython.const[cython.longlong][::1],
        sizes: cython.const[cython.longlong][::1], fields: cython.int, topic: bytes | None,
        queue: str, first_offset: int) -> tuple:
    """The ``fields`` (bits) of the records at ``rel`` (``sizes[i]`` bytes each, as the index
    says) in ``buf`` (a memoryview of bytes; int64 arrays of positions and sizes). Returns
    (topic, key, properties, payload, born): each column an (int32 offsets, uint8 data) pair, the key's with a bool validity third (None: all valid),
    the born times an int64 array (ms); None for a field not asked for, and for the topic when
    ``topic`` (UTF-8) is given and every record has it."""
    n: cython.Py_ssize_t = rel.shape[0]
    if sizes.shape[0] != n:
        raise ValueError(f"{n} positions but {sizes.shape[0]} sizes")
    length = buf.shape[0]
    have_topic = topic is not None
    expected: cython.const[cython.uchar][::1] = topic if have_topic else b""
    n_topic = len(expected)
    same_topic = have_topic
    # field k (0 topic, 1 key, 2 properties, 3 payload): where each record's starts, its length
    starts = np.zeros((4, n), np.int64)
    lengths = np.zeros((4, n), np.int64)
    s: cython.longlong[:, ::1] = starts
    ln: cython.longlong[:, ::1] = lengths
    born = np.zeros(n, np.int64) if fields & BORN else None
    b: cython.longlong[::1] = born if born is not None else np.zeros(0, np.int64)
    # module constants are Python objects: typed local copies for the loop
    head: cython.Py_ssize_t = HEADER_SIZE
    want_magic: cython.Py_ssize_t = MAGIC
    want_born: cython.bint = (fields & BORN) != 0
    # (the header's fields are read inline: a typed memoryview passed to a helper costs more
    # than the read, in reference counting)
    for i in range(n):
        p = rel[i]
        size = sizes[i]
        if p < 0 or size < head or p > length - size:
            raise RecordCorruptError(
                f"queue {queue} offset {first_offset + i}: its record ({size} bytes at {p}) is not within the "
                f"commitlog bytes read ({length})")
        total = (_W(buf[p]) << 24) | (_W(buf[p + 1]) << 16) | (buf[p + 2] << 8) | buf[p + 3]
        magic = (_W(buf[p + 4]) << 24) | (_W(buf[p + 5]) << 16) | (buf[p + 6] << 8) | buf[p + 7]
        if magic != want_magic or total != size:
            raise RecordCorruptError(
                f"queue {queue} offset {first_offset + i}: no valid record at its commitlog position "
                f"(magic {magic:#x}, size {total}, index says {size})")
        lt = (buf[p + 34] << 8) | buf[p + 35]
        lk = (buf[p + 36] << 8) | buf[p + 37]
        lp = (_W(buf[p + 38]) << 24) | (_W(buf[p + 39]) << 16) | (buf[p + 40] << 8) | buf[p + 41]
        lb = (_W(buf[p + 42]) << 24) | (_W(buf[p + 43]) << 16) | (buf[p + 44] << 8) | buf[p + 45]
        end = p + size
        if head + lt + lk + lp + lb > size:
            raise RecordCorruptError(f"queue {queue} offset {first_offset + i}: field lengths exceed the record size")
        s[0, i] = p + head
        ln[0, i] = lt
        s[1, i] = p + head + lt
        ln[1, i] = lk
        s[2, i] = p + head + lt + lk
        ln[2, i] = lp
        s[3, i] = end - lb
        ln[3, i] = lb
        if same_topic:
            if lt != n_topic:
                same_topic = False
            else:
                for j in range(lt):
                    if buf[p + head + j] != expected[j]:
                        same_topic = False
                        break
        if want_born:
            stamp = 0
            for j in range(16, 24):
                stamp = (stamp << 8) | buf[p + j]
            if cython.compiled:
                b[i] = cython.cast(cython.longlong, stamp)  # two's complement
            else:
                b[i] = stamp - (stamp >> 63 << 64)
    out: list = [None, None, None, None, born]
    for k in range(4):
        if not fields & (1 << k) or (k == 0 and same_topic):
            continue
        offsets = np.zeros(n + 1, np.int32)
        column = int(lengths[k].sum())
        if column > _MAX_COLUMN:
            raise ValueError(f"{column} bytes of one field in one batch: more than an int32-offset column holds")
        np.cumsum(lengths[k], out=offsets[1:])
        data = np.empty(column, np.uint8)
        _copy(data, buf, starts[k], offsets, n)
        out[k] = (offsets, data, None if k != 1 or n == 0 or lengths[1].all() else lengths[1] > 0)
    return tuple(out)
