"""Event patterns (the AWS EventBridge / rocketmq-eventbridge language) compiled, once, into a
matcher of decoded events: ``compile_pattern`` checks a pattern and builds closures that test
an event's fields; a bad pattern raises ``PatternError`` naming the JSON path and the reason.

A pattern is an object whose fields are either objects (the event's nested object of that name)
or lists of matchers, OR-ed; fields are AND-ed, and ``$or`` takes a list of patterns of which one
must match. docs/rules.md describes each operator and where we differ from AWS and rocketmq.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32  # nesting of objects and $or in one pattern (the compiler recurses on it)
OR = "$or"
NUMERIC_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
OPERATORS = ("prefix", "suffix", "contains", "anything-but", "numeric", "exists", "cidr", "equals-ignore-case",
             "wildcard")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # a field the event does not have
_EMPTY: dict[str, Any] = {}  # what a nested pattern is matched against where the event has no object

Test = Callable[[Any], bool]  # one leaf value -> matched
FieldTest = Callable[[Any], bool]  # a field's raw value (or MISSING) -> matched


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


# -- matchers: one test of a leaf value each ------------------------------------------------------
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


# -- compiling ---------------------------------------------------------------------------------------
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


def _compile_field(node: FieldNode) -> FieldTest:
    exists_true = any(isinstance(m, Exists) and m.present for m in node.matchers)
    exists_false = any(isinstance(m, Exists) and not m.present for m in node.matchers)
    tests = [m.compile() for m in node.matchers if not isinstance(m, Exists)]
    one: Test | None
    if not tests:
        one = None
    elif len(tests) == 1:
        one = tests[0]
    else:
        def one(v: Any) -> bool:
            for t in tests:
                if t(v):
                    return True
            return False
    if one is not None and not exists_true and not exists_false:
        leaf = one

        def field(v: Any) -> bool:  # the common case: values only
            tv = type(v)
            if tv is list:
                for x in leaf_values(v):
                    if leaf(x):
                        return True
                return False
            return v is not MISSING and tv is not dict and leaf(v)
        return field

    def field_with_exists(v: Any) -> bool:
        tv = type(v)
        if tv is list:
            leaves = leaf_values(v)
            if not leaves:
                return exists_false
            if exists_true:
                return True
            if one is not None:
                for x in leaves:
                    if one(x):
                        return True
            return False
        if v is MISSING or tv is dict:
            return exists_false
        return exists_true or (one is not None and one(v))
    return field_with_exists


def _order(item: tuple[str, FieldNode | ObjectNode]) -> int:
    """Cheap, selective fields first (the fields are AND-ed: order changes no answer)."""
    node = item[1]
    if isinstance(node, ObjectNode):
        return 3
    if all(isinstance(m, Exact) for m in node.matchers):
        return 0
    if all(isinstance(m, (Numeric, Prefix, Suffix, IgnoreCase)) for m in node.matchers):
        return 1
    return 2


def _compile_nested(sub: Callable[[dict[str, Any]], bool]) -> FieldTest:
    def nested(v: Any) -> bool:
        tv = type(v)
        if tv is dict:
            return sub(v)
        if tv is list:
            objects = objects_in(v)
            if objects:
                for o in objects:
                    if sub(o):
                        return True
                return False
        return sub(_EMPTY)
    return nested


def _compile_object(node: ObjectNode) -> Callable[[dict[str, Any]], bool]:
    """The test of an object: each field's (a nested object's own test called straight away
    when the event has an object there, the common case), then one of the $or alternatives."""
    entries: list[tuple[str, FieldTest, Callable[[dict[str, Any]], bool] | None]] = []
    for key, child in sorted(node.fields, key=_order):
        if isinstance(child, FieldNode):
            entries.append((key, _compile_field(child), None))
        else:
            sub = _compile_object(child)
            entries.append((key, _compile_nested(sub), sub))
    pairs = tuple(entries)
    alternatives = tuple(_compile_object(a) for a in node.alternatives)
    if len(pairs) == 1 and not alternatives and pairs[0][2] is None:
        ((key, test, _),) = pairs
        return lambda obj: test(obj.get(key, MISSING))

    def check(obj: dict[str, Any]) -> bool:
        get = obj.get
        for key, test, sub in pairs:
            v = get(key, MISSING)
            if sub is not None and type(v) is dict:
                if not sub(v):
                    return False
            elif not test(v):
                return False
        if alternatives:
            for alternative in alternatives:
                if alternative(obj):
                    return True
            return False
        return True
    return check


class CompiledPattern:
    """A pattern checked and compiled: ``matches(event)`` tests a decoded event (normally a
    dict); ``check(event)`` is the same for an event known to be a dict."""

    __slots__ = ("source", "tree", "check", "matches")

    def __init__(self, tree: ObjectNode, source: Any) -> None:
        self.source = source  # the pattern as decoded JSON
        self.tree = tree
        self.check = check = _compile_object(tree)
        empty = _EMPTY

        def matches(event: Any) -> bool:
            return check(event if type(event) is dict else empty)
        self.matches: Callable[[Any], bool] = matches

    def __repr__(self) -> str:
        return f"CompiledPattern({json.dumps(self.source, sort_keys=True)})"


def compile_pattern(pattern: str | bytes | Mapping[str, Any]) -> CompiledPattern:
    """Check ``pattern`` (JSON text or decoded) and compile it; PatternError if it is bad."""
    tree = parse_pattern(pattern)
    source = json.loads(pattern) if isinstance(pattern, (str, bytes, bytearray)) else pattern
    return CompiledPattern(tree, source)
