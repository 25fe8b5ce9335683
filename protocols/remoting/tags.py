"""Tags: the tags code RocketMQ keeps in consume-queue entries (Java's ``String.hashCode`` of
the TAGS property) and subscription expressions of type TAG ("*", "TagA || TagB")."""

from __future__ import annotations

from ..java_hash import string_hash

SUB_ALL = "*"
EXPRESSION_TAG = "TAG"
EXPRESSION_SQL92 = "SQL92"
_TAG_SEPARATOR = "||"
JAVA_TRIM = "".join(map(chr, range(0x21)))  # String.trim strips every char up to the space


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
    return None if tags is None else frozenset(map(string_hash, tags))
