"""Java's ``String.hashCode``: the tags code RocketMQ keeps in consume-queue entries and the hash
its proxy shards ordered messages by, so both must match Java's to the bit."""

from __future__ import annotations

import sys
from array import array

_UTF16 = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"  # native order, for array('H')


def string_hash(text: str) -> int:
    """``text.hashCode()``: the sum of its UTF-16 code units times powers of 31, as a signed
    32-bit int (0 for the empty string). A lone surrogate is one code unit, as in Java."""
    h = 0
    units = map(ord, text) if text.isascii() else array("H", text.encode(_UTF16, "surrogatepass"))
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h
