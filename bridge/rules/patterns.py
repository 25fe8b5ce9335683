"""Event patterns (the AWS EventBridge / rocketmq-eventbridge language) compiled, once, into a
matcher of decoded events: ``compile_pattern`` checks a pattern (pattern_parser.py) and builds
closures of its matchers (matchers.py) that test an event's fields; a bad pattern raises
``PatternError`` naming the JSON path and the reason.

A pattern is an object whose fields are either objects (the event's nested object of that name)
or lists of matchers, OR-ed; fields are AND-ed, and ``$or`` takes a list of patterns of which one
must match. docs/rules.md describes each operator and where we differ from AWS and rocketmq.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from .matchers import MISSING, Exact, Exists, IgnoreCase, Numeric, Prefix, Suffix, Test, leaf_values, objects_in
from .pattern_parser import FieldNode, ObjectNode, PatternError, parse_pattern

__all__ = ["CompiledPattern", "PatternError", "compile_pattern"]

_EMPTY: dict[str, Any] = {}  # what a nested pattern is matched against where the event has no object
FieldTest = Callable[[Any], bool]  # a field's raw value (or MISSING) -> matched


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
