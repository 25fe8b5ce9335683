"""Tags: the tags code RocketMQ keeps in consume-queue entries (Java's ``String.hashCode`` of
the TAGS property) and subscription expressions of type TAG ("*", "TagA || TagB")."""

from __future__ import annotations

import sys
from array import array

SUB_ALL = "*"
EXPRESSION_TAG = "TAG"
EXPRESSION_SQL92 = "SQL92"
_TAG_SEPARATOR = "||"
_UTF16 = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"  # native order, for array('H')
JAVA_TRIM = "".join(map(chr, range(0x21)))  # String.trim strips every char up to the space


def tag_hash(tag: str) -> int:
    """Java's ``tag.hashCode()``: sum of UTF-16 code units times powers of 31, as a signed
    32-bit int (0 for the empty string)."""
    h = 0
    units = map(ord, tag) if tag.isascii() else array("H", tag.encode(_UTF16, "surrogatepass"))
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def parse_subscription(expression: str | None) -> frozenset[str] | None:
    """The tags a TAG expression selects; None selects every message (empty, None or "*").
    As FilterAPI does: split at "||", trim, drop empty parts. A set left empty selects nothing
    on the broker (its filter compares tag codes); "*" among other tags is a literal tag."""
    if not expression or expression == SUB_ALL:
        return None
    return frozenset(t for t in (part.strip(JAVA_TRIM) for part in expression.split(_TAG_SEPARATOR)) if t)


def subscription_codes(expression: str | None) -> frozenset[int] | None:
    """The tag codes (consume-queue filter) of a TAG expression; None selects everything."""
    tags = parse_subscription(expression)
    return None if tags is None else frozenset(map(tag_hash, tags))
