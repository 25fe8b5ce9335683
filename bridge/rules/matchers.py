"""The matchers of event patterns, one test of a leaf value each (exact values, prefix, suffix,
equals-ignore-case, contains, wildcard, numeric ranges, CIDR blocks, anything-but, exists), and
``MISSING``, the value of a field an event does not have. Each matcher's ``compile`` makes its
test once; patterns.py puts them together."""

from __future__ import annotations

import ipaddress
import math
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # a field the event does not have

Test = Callable[[Any], bool]  # one leaf value -> matched


@dataclass(frozen=True, slots=True)
class Exact:
    """Equal to one of ``values``: strings exactly, numbers by value, true, false, null."""

    values: tuple[Any, ...]

    def compile(self) -> Test:
        strings = frozenset(v for v in self.values if type(v) is str)
        numbers = frozenset(v for v in self.values if type(v) in (int, float))
        has_null = any(v is None for v in self.values)
        has_true = any(v is True for v in self.values)
        has_false = any(v is False for v in self.values)
        if not numbers and not (has_null or has_true or has_false):
            if len(strings) == 1:
                (only,) = strings
                return lambda v: v == only and type(v) is str
            return lambda v: type(v) is str and v in strings

        def test(v: Any) -> bool:
            tv = type(v)
            if tv is str:
                return v in strings
            if tv is int or tv is float:
                return v in numbers
            if v is None:
                return has_null
            if v is True:
                return has_true
            if v is False:
                return has_false
            return False
        return test


@dataclass(frozen=True, slots=True)
class IgnoreCase:
    """A string equal to one of ``texts`` in Unicode case folding."""

    texts: tuple[str, ...]

    def compile(self) -> Test:
        folded = frozenset(t.casefold() for t in self.texts)
        return lambda v: type(v) is str and v.casefold() in folded


@dataclass(frozen=True, slots=True)
class Prefix:
    text: str
    ignore_case: bool = False

    def compile(self) -> Test:
        if self.ignore_case:
            folded = self.text.casefold()
            return lambda v: type(v) is str and v.casefold().startswith(folded)
        text = self.text
        return lambda v: type(v) is str and v.startswith(text)


@dataclass(frozen=True, slots=True)
class Suffix:
    text: str
    ignore_case: bool = False

    def compile(self) -> Test:
        if self.ignore_case:
            folded = self.text.casefold()
            return lambda v: type(v) is str and v.casefold().endswith(folded)
        text = self.text
        return lambda v: type(v) is str and v.endswith(text)


@dataclass(frozen=True, slots=True)
class Contains:
    """A string with ``text`` in it (rocketmq-eventbridge's ``contains``)."""

    text: str

    def compile(self) -> Test:
        text = self.text
        return lambda v: type(v) is str and text in v


@dataclass(frozen=True, slots=True)
class Wildcard:
    """A string matching one of ``patterns``: ``*`` is any run of characters, ``\\*`` a star."""

    patterns: tuple[str, ...]

    def compile(self) -> Test:
        regex = re.compile("|".join(f"(?:{_wildcard_regex(p)})" for p in self.patterns), re.DOTALL)
        full = regex.fullmatch
        return lambda v: type(v) is str and full(v) is not None


def _wildcard_regex(pattern: str) -> str:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(re.escape(pattern[i + 1]))  # (checked by _parse_wildcard: an escape is whole)
            i += 2
            continue
        out.append(".*" if c == "*" else re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Numeric:
    """A JSON number in one of ``intervals`` (low, low included, high, high included)."""

    intervals: tuple[tuple[float, bool, float, bool], ...]

    def compile(self) -> Test:
        if len(self.intervals) == 1:
            lo, lo_in, hi, hi_in = self.intervals[0]
            if lo_in and hi_in:
                return lambda v: (type(v) is int or type(v) is float) and lo <= v <= hi
            if lo == -math.inf:
                if hi_in:
                    return lambda v: (type(v) is int or type(v) is float) and v <= hi
                return lambda v: (type(v) is int or type(v) is float) and v < hi
            if hi == math.inf:
                if lo_in:
                    return lambda v: (type(v) is int or type(v) is float) and v >= lo
                return lambda v: (type(v) is int or type(v) is float) and v > lo
        intervals = self.intervals

        def test(v: Any) -> bool:
            if type(v) is not int and type(v) is not float:
                return False
            for lo, lo_in, hi, hi_in in intervals:
                if (v > lo or (lo_in and v == lo)) and (v < hi or (hi_in and v == hi)):
                    return True
            return False
        return test


@dataclass(frozen=True, slots=True)
class Cidr:
    """A string that is an IP address (v4 or v6) inside ``network``."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network

    def compile(self) -> Test:
        version = self.network.version
        first = int(self.network.network_address)
        last = int(self.network.broadcast_address)

        def test(v: Any) -> bool:
            if type(v) is not str:
                return False
            address = address_value(v)
            return address is not None and address[0] == version and first <= address[1] <= last
        return test


def address_value(text: str) -> tuple[int, int] | None:
    """(4 or 6, the address as an integer) of an IP address in text, or None: not one."""
    try:
        if ":" in text:
            return 6, int.from_bytes(socket.inet_pton(socket.AF_INET6, text), "big")
        return 4, int.from_bytes(socket.inet_pton(socket.AF_INET, text), "big")
    except (OSError, ValueError):  # (ValueError: an embedded NUL)
        return None


@dataclass(frozen=True, slots=True)
class AnythingBut:
    """A present leaf that ``excluded`` does not match; for the string operators (prefix, suffix,
    equals-ignore-case, wildcard) only a string is such a leaf."""

    excluded: Exact | Prefix | Suffix | IgnoreCase | Wildcard

    def compile(self) -> Test:
        excluded = self.excluded.compile()
        if isinstance(self.excluded, Exact):
            return lambda v: not excluded(v)
        return lambda v: type(v) is str and not excluded(v)


@dataclass(frozen=True, slots=True)
class Exists:
    present: bool

    def compile(self) -> Test:  # (a field's test reads ``present`` itself: see _compile_field)
        raise TypeError("exists is tested on the field, not on a value")


Matcher = Exact | IgnoreCase | Prefix | Suffix | Contains | Wildcard | Numeric | Cidr | AnythingBut | Exists


def leaf_values(values: list[Any]) -> list[Any]:
    """The leaf values of a list (nested lists flattened, objects are no leaves)."""
    out: list[Any] = []
    for v in values:
        tv = type(v)
        if tv is list:
            out.extend(leaf_values(v))
        elif tv is not dict:
            out.append(v)
    return out


def objects_in(values: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in values:
        tv = type(v)
        if tv is dict:
            out.append(v)
        elif tv is list:
            out.extend(objects_in(v))
    return out

