"""The values a SQL92 filter computes with, and how RocketMQ's filter (Java) compares them.

Java types map to Python ones: String -> str, Boolean -> bool, Double -> float, Long -> int,
Integer -> ``Int32`` (an int subclass: a decimal literal that fits 32 bits is an Integer, and
a property string compared with it is parsed as one). Message properties are always strings;
where a comparison needs a number RocketMQ parses them (``Long.valueOf``, ``Double.valueOf``),
and a string that does not parse is an evaluation error, which makes the whole expression
not match (the broker catches it and drops the message).
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

from ..tags import JAVA_TRIM

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
DOUBLE_MIN_VALUE = 5e-324  # Java's Double.MIN_VALUE: the smallest positive double


class Int32(int):
    """A Java Integer (the other ints are Longs)."""

    __slots__ = ()

    def __neg__(self) -> Int32:
        return Int32(-int(self))


class EvalError(Exception):
    """What Java throws while evaluating (NumberFormatException, ClassCastException): the
    message does not match, whatever the rest of the expression says."""


# Integer.valueOf / Long.valueOf: a sign, then decimal digits (Character.digit: any Unicode Nd)
_INTEGER = re.compile(r"[+-]?\d+")
_DEC = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_HEX = r"0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+"
# Double.valueOf after String.trim: NaN, Infinity, decimal or hex, an optional f/F/d/D suffix
_DOUBLE = re.compile(rf"([+-]?)(?:(NaN)|(Infinity)|({_DEC})[fFdD]?|({_HEX})[fFdD]?)")


def parse_int(text: str, bits: int) -> int:
    """``Integer.valueOf`` (bits 32, an ``Int32``) or ``Long.valueOf`` (bits 64)."""
    if _INTEGER.fullmatch(text) is None:
        raise EvalError(f"For input string: {text[:40]!r}")
    if len(text.lstrip("+-").lstrip("0")) > 19:  # (before int(): Python refuses very long digit strings)
        raise EvalError(f"For input string: {text[:40]!r} (out of range)")
    value = int(text)
    low, high = (INT_MIN, INT_MAX) if bits == 32 else (LONG_MIN, LONG_MAX)
    if not low <= value <= high:
        raise EvalError(f"For input string: {text[:40]!r} (out of range)")
    return Int32(value) if bits == 32 else value


def parse_double(text: str) -> float:
    """``Double.valueOf``."""
    m = _DOUBLE.fullmatch(text.strip(JAVA_TRIM))
    if m is None:
        raise EvalError(f"For input string: {text[:40]!r}")
    sign, nan, inf, dec, hexa = m.groups()
    if nan:
        return float("nan")
    if inf:
        return float(sign + "inf")
    if dec:
        return float(sign + dec)
    try:
        return float.fromhex(sign + hexa)
    except OverflowError:  # (Java: Infinity)
        return float(sign + "inf")


def _double_bits(value: float) -> int:
    if math.isnan(value):  # Double.doubleToLongBits: one NaN
        return 0x7FF8000000000000
    return struct.unpack(">q", struct.pack(">d", value))[0]


def _order(lv, rv) -> int:
    if type(lv) is float:  # Double.compareTo: -0.0 < 0.0, NaN above everything and equal to itself
        if lv < rv:
            return -1
        if lv > rv:
            return 1
        lb, rb = _double_bits(lv), _double_bits(rv)
        return (lb > rb) - (lb < rb)
    return (lv > rv) - (lv < rv)


def compare(lv: Any, rv: Any) -> int:
    """Java's ``ComparisonExpression.__compare`` with string conversion on (as RocketMQ's
    parser always sets it): unlike types are converted up (Integer -> Long -> Double), a
    string is parsed as the other side's type; pairs it cannot convert answer -1. (Any: the
    branches test the exact type, as Java's casts do, which mypy cannot follow through ``lt``.)"""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is bool:
            if rt is str:  # (Java casts the Boolean to String here: ClassCastException)
                raise EvalError("a boolean cannot be compared with a string")
            return -1
        if lt is Int32 or lt is int:
            if rt is Int32 or rt is int:
                pass
            elif rt is float:
                lv = float(lv)
            elif rt is str:
                rv = parse_int(rv, 32 if lt is Int32 else 64)
            else:
                return -1
        elif lt is float:
            if rt is Int32 or rt is int:
                rv = float(rv)
            elif rt is str:
                rv = parse_double(rv)
            else:
                return -1
        elif lt is str:
            if rt is bool:
                lv = lv.lower() == "true"  # Boolean.valueOf
            elif rt is Int32:
                lv = parse_int(lv, 32)
            elif rt is int:
                lv = parse_int(lv, 64)
            elif rt is float:
                lv = parse_double(lv)
            else:
                return -1
        else:
            return -1
    return _order(lv, rv)


def is_number(value: object) -> bool:
    return type(value) is Int32 or type(value) is int or type(value) is float


def java_repr(value: object) -> str:
    """A constant as RocketMQ prints it in its messages."""
    if value is None:
        return "NULL"
    if type(value) is bool:
        return "TRUE" if value else "FALSE"
    if type(value) is str:
        return "'" + value.replace("'", "''") + "'"
    if type(value) is float:
        return repr(value).replace("e", "E").replace("inf", "Infinity")
    return str(int(value))  # type: ignore[call-overload]  # (an int or Int32 by now)
