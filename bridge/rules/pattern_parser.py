"""Event patterns (the AWS EventBridge / rocketmq-eventbridge language) parsed and checked into
a tree (``parse_pattern``): objects of fields, each field a list of matchers, and ``$or``
alternatives; a bad pattern raises ``PatternError`` naming the JSON path and the reason."""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .matchers import AnythingBut, Cidr, Contains, Exact, Exists, IgnoreCase, Matcher, Numeric, Prefix, Suffix, Wildcard

MAX_DEPTH = 32  # nesting of objects and $or in one pattern (the compiler recurses on it)
OR = "$or"
NUMERIC_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
OPERATORS = ("prefix", "suffix", "contains", "anything-but", "numeric", "exists", "cidr", "equals-ignore-case",
             "wildcard")


class PatternError(ValueError):
    """A pattern refused at compile time: ``path`` is the JSON path of the problem in the
    pattern (``$`` is the whole pattern), ``reason`` says what is wrong there."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _key_path(path: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):  # (RFC 9535 member-name shorthand)
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


def _is_number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


# -- the parsed pattern --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FieldNode:
    """A field with a list of matchers (OR-ed); ``path`` from the event's root."""

    path: tuple[str, ...]
    matchers: tuple[Matcher, ...]


@dataclass(frozen=True, slots=True)
class ObjectNode:
    """Fields that must all match (each a FieldNode or a nested ObjectNode, by key) and ``$or``
    alternatives (a tuple of ObjectNodes of which one must match)."""

    path: tuple[str, ...]
    fields: tuple[tuple[str, FieldNode | ObjectNode], ...]
    alternatives: tuple[ObjectNode, ...] = ()


def parse_pattern(pattern: str | bytes | Mapping[str, Any]) -> ObjectNode:
    """The checked tree of a pattern given as JSON text or already decoded."""
    if isinstance(pattern, (str, bytes, bytearray)):
        try:
            decoded = json.loads(pattern, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant)
        except json.JSONDecodeError as exc:
            raise PatternError("$", f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    else:
        decoded = pattern
    if not isinstance(decoded, Mapping):
        raise PatternError("$", f"a pattern is a JSON object, not {_kind(decoded)}")
    return _parse_object(decoded, "$", (), 0, top=True)


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise PatternError("$", f"the key {json.dumps(key)} appears twice in one object")
        out[key] = value
    return out


def _refuse_constant(name: str) -> Any:
    raise PatternError("$", f"{name} is not a JSON number")


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _parse_object(obj: Mapping[str, Any], path: str, at: tuple[str, ...], depth: int, top: bool = False
                  ) -> ObjectNode:
    if depth > MAX_DEPTH:
        raise PatternError(path, f"nested deeper than {MAX_DEPTH} levels")
    if not obj and not top:
        raise PatternError(path, "an object in a pattern needs at least one field")
    fields: list[tuple[str, FieldNode | ObjectNode]] = []
    alternatives: tuple[ObjectNode, ...] = ()
    for key, value in obj.items():
        if not isinstance(key, str):
            raise PatternError(path, f"field names are strings, not {_kind(key)}")
        here = _key_path(path, key)
        if key == OR:
            alternatives = _parse_or(value, here, at, depth)
        elif isinstance(value, Mapping):
            fields.append((key, _parse_object(value, here, (*at, key), depth + 1)))
        elif isinstance(value, list):
            fields.append((key, FieldNode((*at, key), _parse_matchers(value, here))))
        else:
            raise PatternError(here, f"a field's value is a list of matchers or an object, not {_kind(value)}"
                               f" (write [{json.dumps(value)}] to match that value)")
    return ObjectNode(at, tuple(fields), alternatives)


def _parse_or(value: Any, path: str, at: tuple[str, ...], depth: int) -> tuple[ObjectNode, ...]:
    if not isinstance(value, list) or len(value) < 2:
        raise PatternError(path, "$or takes a list of at least two patterns (objects)")
    out = []
    for i, alternative in enumerate(value):
        here = f"{path}[{i}]"
        if not isinstance(alternative, Mapping) or not alternative:
            raise PatternError(here, f"each $or alternative is a non-empty object, not {_kind(alternative)}")
        out.append(_parse_object(alternative, here, at, depth + 1))
    return tuple(out)


def _parse_matchers(values: list[Any], path: str) -> tuple[Matcher, ...]:
    if not values:
        raise PatternError(path, "a field needs at least one matcher; [] would match nothing")
    exact: list[Any] = []
    out: list[Matcher] = []
    for i, value in enumerate(values):
        here = f"{path}[{i}]"
        if value is None or isinstance(value, (str, bool)):
            exact.append(value)
        elif isinstance(value, (int, float)):
            exact.append(_number(value, here))
        elif isinstance(value, Mapping):
            out.append(_parse_operator(value, here))
        else:
            raise PatternError(here, f"a matcher is a value or an operator object, not {_kind(value)}")
    if exact:
        out.insert(0, Exact(tuple(exact)))
    return tuple(out)


def _number(value: Any, path: str) -> int | float:
    if not _is_number(value):
        raise PatternError(path, f"a number is expected here, not {_kind(value) if not isinstance(value, float) else value}")
    return value


def _string(value: Any, path: str, what: str) -> str:
    if not isinstance(value, str):
        raise PatternError(path, f"{what} takes a string, not {_kind(value)}")
    return value


def _strings(value: Any, path: str, what: str) -> tuple[str, ...]:
    """A string or a non-empty list of strings."""
    if isinstance(value, list):
        if not value:
            raise PatternError(path, f"{what} takes a string or a non-empty list of strings")
        return tuple(_string(v, f"{path}[{i}]", what) for i, v in enumerate(value))
    return (_string(value, path, what),)


def _parse_operator(obj: Mapping[str, Any], path: str) -> Matcher:
    if len(obj) != 1:
        names = ", ".join(json.dumps(k) for k in obj) or "none"
        raise PatternError(path, f"an operator object has exactly one operator, this one has {names}")
    ((name, value),) = obj.items()
    here = _key_path(path, name)
    if name == "prefix" or name == "suffix":
        kind = Prefix if name == "prefix" else Suffix
        if isinstance(value, Mapping):
            return kind(_ignore_case_text(value, here, name), ignore_case=True)
        return kind(_string(value, here, name))
    if name == "equals-ignore-case":
        return IgnoreCase(_strings(value, here, name))
    if name == "contains":
        return Contains(_string(value, here, name))
    if name == "wildcard":
        return Wildcard(tuple(_parse_wildcard(p, here) for p in _strings(value, here, name)))
    if name == "anything-but":
        return AnythingBut(_parse_anything_but(value, here))
    if name == "numeric":
        return Numeric(_parse_numeric(value, here))
    if name == "exists":
        if not isinstance(value, bool):
            raise PatternError(here, f"exists takes true or false, not {_kind(value)}")
        return Exists(value)
    if name == "cidr":
        text = _string(value, here, name)
        try:
            return Cidr(ipaddress.ip_network(text, strict=True))
        except ValueError as exc:
            raise PatternError(here, f"not an IPv4 or IPv6 CIDR block: {exc}") from None
    raise PatternError(here, f"unknown operator {json.dumps(name)}; known: {', '.join(OPERATORS)}")


def _ignore_case_text(value: Mapping[str, Any], path: str, operator: str) -> str:
    if list(value) != ["equals-ignore-case"]:
        raise PatternError(path, f"{operator} takes a string or {{\"equals-ignore-case\": string}}")
    return _string(value["equals-ignore-case"], _key_path(path, "equals-ignore-case"), "equals-ignore-case")


def _parse_wildcard(pattern: str, path: str) -> str:
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern) or pattern[i + 1] not in "*\\":
                raise PatternError(path, f"wildcard {json.dumps(pattern)}: a backslash escapes only * or \\"
                                         f" (at character {i})")
            i += 2
            continue
        if c == "*" and pattern.startswith("**", i):
            raise PatternError(path, f"wildcard {json.dumps(pattern)}: consecutive * (at character {i})")
        i += 1
    return pattern


def _parse_anything_but(value: Any, path: str) -> Exact | Prefix | Suffix | IgnoreCase | Wildcard:
    if isinstance(value, Mapping):
        if len(value) != 1:
            raise PatternError(path, "anything-but takes one of prefix, suffix, equals-ignore-case, wildcard")
        ((name, inner),) = value.items()
        here = _key_path(path, name)
        if name == "prefix":
            return Prefix(_string(inner, here, "anything-but prefix"))
        if name == "suffix":
            return Suffix(_string(inner, here, "anything-but suffix"))
        if name == "equals-ignore-case":
            return IgnoreCase(_strings(inner, here, "anything-but equals-ignore-case"))
        if name == "wildcard":
            return Wildcard(tuple(_parse_wildcard(p, here) for p in _strings(inner, here, "anything-but wildcard")))
        raise PatternError(here, f"anything-but takes prefix, suffix, equals-ignore-case or wildcard, "
                                 f"not {json.dumps(name)}")
    values = value if isinstance(value, list) else [value]
    if not values:
        raise PatternError(path, "anything-but takes a value or a non-empty list of values")
    out: list[Any] = []
    for i, v in enumerate(values):
        here = f"{path}[{i}]" if isinstance(value, list) else path
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(_number(v, here))
        else:
            raise PatternError(here, f"anything-but excludes strings and numbers, not {_kind(v)}")
    return Exact(tuple(out))


_LOWER = {">": False, ">=": True}
_UPPER = {"<": False, "<=": True}


def _parse_numeric(value: Any, path: str) -> tuple[tuple[float, bool, float, bool], ...]:
    if not isinstance(value, list) or len(value) not in (2, 4):
        raise PatternError(path, "numeric takes [operator, number] or [lower operator, number, upper operator, "
                                 "number]")
    pairs = []
    for i in range(0, len(value), 2):
        op = value[i]
        if op not in NUMERIC_OPERATORS:
            raise PatternError(f"{path}[{i}]", f"unknown numeric operator {json.dumps(op)}; known: "
                                               f"{', '.join(NUMERIC_OPERATORS)}")
        pairs.append((op, _number(value[i + 1], f"{path}[{i + 1}]"), i))
    inf = math.inf
    if len(pairs) == 1:
        op, x, _ = pairs[0]
        if op == "=":
            return ((x, True, x, True),)
        if op == "!=":
            return ((-inf, False, x, False), (x, False, inf, False))
        if op in _LOWER:
            return ((x, _LOWER[op], inf, False),)
        return ((-inf, False, x, _UPPER[op]),)
    lower = [p for p in pairs if p[0] in _LOWER]
    upper = [p for p in pairs if p[0] in _UPPER]
    if len(lower) != 1 or len(upper) != 1:
        bad = next(p for p in pairs if p[0] in ("=", "!=")) if any(p[0] in ("=", "!=") for p in pairs) else pairs[1]
        raise PatternError(f"{path}[{bad[2]}]", "a numeric range is one lower bound (> or >=) and one upper "
                                                "bound (< or <=); = and != stand alone")
    (lo_op, lo, _), (hi_op, hi, hi_at) = lower[0], upper[0]
    lo_in, hi_in = _LOWER[lo_op], _UPPER[hi_op]
    if lo > hi or (lo == hi and not (lo_in and hi_in)):
        raise PatternError(f"{path}[{hi_at + 1}]", f"the range {lo_op} {lo} and {hi_op} {hi} holds no number")
    return ((lo, lo_in, hi, hi_in),)
