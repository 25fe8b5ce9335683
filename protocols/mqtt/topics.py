# cython: annotation_typing=False
"""MQTT topic names and topic filters: validation, matching and shared-subscription parsing.

The one place in TideMQ that knows MQTT's topic rules (OASIS MQTT 5.0 section 4.7, the same
in 3.1.1 section 4.7): levels split on ``/``, ``+`` matches one level, ``#`` the rest, and
filters starting with a wildcard never match topics starting with ``$``.

Compiled by Cython (pyproject.toml ``[tool.tidemq] compiled``): every inbound PUBLISH is
validated here and every delivery to a wildcard subscriber matched; the same file runs
interpreted with ``TIDEMQ_PURE_PYTHON=1``. Its annotations are for readers and type checkers
only (``annotation_typing=False``, first line): compiled, a ``str`` annotation would refuse
None, ``str`` subclasses and other types, where the interpreted functions raise TopicError or
work.
"""

from __future__ import annotations

from typing import NamedTuple

import cython

MAX_TOPIC_BYTES = 65_535
SHARE_PREFIX = "$share/"


class TopicError(ValueError):
    """A topic name or filter that breaks the MQTT rules."""


@cython.cfunc
def _check_string(text: str, what: str) -> None:
    if not text:
        raise TopicError(f"{what} must be at least one character")
    if "\x00" in text:
        raise TopicError(f"{what} must not contain U+0000")
    if len(text) > MAX_TOPIC_BYTES // 4 and len(text.encode()) > MAX_TOPIC_BYTES:
        raise TopicError(f"{what} is longer than {MAX_TOPIC_BYTES} bytes")


def validate_topic_name(topic: str) -> None:
    """A topic a PUBLISH may carry: no wildcards."""
    _check_string(topic, "a topic name")
    if "+" in topic or "#" in topic:
        raise TopicError(f"a topic name must not contain wildcards: {topic!r}")


def validate_topic_filter(topic_filter: str) -> None:
    """A filter a SUBSCRIBE may carry, without a ``$share/`` prefix (see parse_shared)."""
    _check_string(topic_filter, "a topic filter")
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            raise TopicError(f"'#' must be a whole level and the last one: {topic_filter!r}")
        if "+" in level and level != "+":
            raise TopicError(f"'+' must be a whole level: {topic_filter!r}")


@cython.ccall  # compiled, matches() calls it in C
def is_wildcard(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


class SharedFilter(NamedTuple):
    group: str | None  # None: not a shared subscription
    topic_filter: str


def parse_shared(text: str) -> SharedFilter:
    """Split ``$share/{group}/{filter}``; validates the group and the filter."""
    if not text.startswith(SHARE_PREFIX):
        validate_topic_filter(text)
        return SharedFilter(None, text)
    group, sep, topic_filter = text[len(SHARE_PREFIX):].partition("/")
    if not group or not sep or "+" in group or "#" in group:
        raise TopicError(f"a shared subscription is $share/{{group}}/{{filter}}: {text!r}")
    validate_topic_filter(topic_filter)
    return SharedFilter(group, topic_filter)


@cython.locals(i=cython.Py_ssize_t, f_levels=list, t_levels=list)
def matches(topic_filter: str, topic: str) -> bool:
    """Whether a (validated) filter matches a (validated) topic name."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    if not is_wildcard(topic_filter):
        return topic_filter == topic
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, level in enumerate(f_levels):
        if level == "#":
            return True  # also matches the parent level: "a/#" matches "a"
        if i >= len(t_levels):
            return False
        if level != "+" and level != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


def covers(outer: str, inner: str) -> bool:
    """Whether every topic ``inner`` matches is matched by ``outer`` (both validated filters):
    ``covers("a/#", "a/+/b")`` but not ``covers("a/+", "a/#")``."""
    if inner.startswith("$") and outer[:1] in ("+", "#"):
        return False
    o_levels = outer.split("/")
    i_levels = inner.split("/")
    for i, level in enumerate(o_levels):
        if level == "#":
            return True
        if i >= len(i_levels):
            return False
        inner_level = i_levels[i]
        if inner_level == "#":
            return False  # inner reaches any depth here, outer does not
        if level == "+":
            continue
        if inner_level == "+" or inner_level != level:
            return False
    return len(o_levels) == len(i_levels)


def overlaps(first: str, second: str) -> bool:
    """Whether some topic name is matched by both (validated) filters: ``overlaps("a/+",
    "+/b")`` (``a/b``), not ``overlaps("a/+", "a/b/c")``."""
    if first.startswith("$") != second.startswith("$"):
        # a filter starting with a wildcard matches no "$" topic; a literal "$..." level only
        # meets a wildcard first level, which never reaches "$" topics
        return False
    a_levels = first.split("/")
    b_levels = second.split("/")
    for i in range(max(len(a_levels), len(b_levels))):
        a = a_levels[i] if i < len(a_levels) else None
        b = b_levels[i] if i < len(b_levels) else None
        if a == "#" or b == "#":
            return True  # (also when the other ended one level before: "a/#" matches "a")
        if a is None or b is None:
            return False
        if a != "+" and b != "+" and a != b:
            return False
    return True
