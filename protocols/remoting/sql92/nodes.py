"""The expression tree of a SQL92 filter and its evaluation, with RocketMQ's three-valued
logic: ``evaluate`` answers a value, True/False, or None (unknown: a missing property); a
message matches only when the whole expression is True.

Which nodes are "boolean" matters at parse time (RocketMQ's BooleanExpression): AND, OR and
NOT take only those (or a property, cast), and ordering comparisons refuse them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .values import EvalError, compare, is_number, java_repr, parse_double

Properties = Mapping[str, str]


class Node:
    __slots__ = ("depth",)
    depth: int  # the height of the tree below and with this node (the parser's limit)
    boolean = False  # a BooleanExpression in RocketMQ's terms

    def evaluate(self, props: Properties) -> Any:
        raise NotImplementedError


class Constant(Node):
    __slots__ = ("value",)

    def __init__(self, value: object, depth: int = 1) -> None:
        self.value = value
        self.depth = depth

    @property
    def boolean(self) -> bool:  # type: ignore[override]  # TRUE, FALSE and NULL literals
        return self.value is None or type(self.value) is bool

    def evaluate(self, props: Properties) -> Any:
        return self.value

    def __str__(self) -> str:
        return java_repr(self.value)


class Property(Node):
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name
        self.depth = 1

    def evaluate(self, props: Properties) -> Any:
        return props.get(self.name)

    def __str__(self) -> str:
        return self.name


class Unary(Node):
    __slots__ = ("operand",)

    def __init__(self, operand: Node) -> None:
        self.operand = operand
        self.depth = operand.depth + 1


class Negate(Unary):
    __slots__ = ()

    def evaluate(self, props: Properties) -> Any:
        value = self.operand.evaluate(props)
        return -value if is_number(value) else None  # (a string or null: null)

    def __str__(self) -> str:
        return f"(- {self.operand})"


class BooleanCast(Unary):
    """A property where a boolean is wanted: null when absent, else FALSE (it is a string)."""

    __slots__ = ()
    boolean = True

    def evaluate(self, props: Properties) -> Any:
        value = self.operand.evaluate(props)
        if value is None:
            return None
        return value if type(value) is bool else False

    def __str__(self) -> str:
        return str(self.operand)


class Not(Unary):
    __slots__ = ()
    boolean = True

    def evaluate(self, props: Properties) -> Any:
        value = self.operand.evaluate(props)
        return None if value is None else not value

    def __str__(self) -> str:
        return f"(NOT {self.operand})"


class Logic(Node):
    """AND / OR over a chain of operands, left to right, stopping as Java's nested binary
    nodes do (a chain is flat here so that a long one does not nest deeply)."""

    __slots__ = ("is_and", "operands")
    boolean = True

    def __init__(self, operands: list[Node], is_and: bool) -> None:
        self.operands = operands
        self.is_and = is_and
        self.depth = max(o.depth for o in operands) + 1

    def evaluate(self, props: Properties) -> Any:
        decisive = not self.is_and  # AND stops at FALSE, OR at TRUE
        unknown = False
        for operand in self.operands:
            value = operand.evaluate(props)
            if value is None:
                unknown = True
            elif value is decisive:
                return decisive
        return None if unknown else not decisive

    def __str__(self) -> str:
        return "(" + (" AND " if self.is_and else " OR ").join(map(str, self.operands)) + ")"


class Equal(Node):
    """``=`` (and IS NULL, ``<>`` as its NOT). As Java's: a null left side is unknown, a null
    right side (with a left one) FALSE, two nulls TRUE."""

    __slots__ = ("left", "right")
    boolean = True

    def __init__(self, left: Node, right: Node) -> None:
        self.left, self.right = left, right
        self.depth = max(left.depth, right.depth) + 1

    def evaluate(self, props: Properties) -> Any:
        lv = self.left.evaluate(props)
        rv = self.right.evaluate(props)
        if lv is None or rv is None:
            return None if lv is None and rv is not None else lv is rv
        return compare(lv, rv) == 0

    def __str__(self) -> str:
        return f"({self.left} = {self.right})"


_ORDER = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}


class Order(Node):
    """``>``, ``>=``, ``<``, ``<=``: unknown when a side is null; two strings (two properties)
    are compared as doubles."""

    __slots__ = ("left", "op", "right", "test")
    boolean = True

    def __init__(self, left: Node, op: str, right: Node) -> None:
        self.left, self.op, self.right = left, op, right
        self.test = _ORDER[op]
        self.depth = max(left.depth, right.depth) + 1

    def evaluate(self, props: Properties) -> Any:
        lv = self.left.evaluate(props)
        if lv is None:
            return None
        rv = self.right.evaluate(props)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            try:
                return self.test(compare(parse_double(lv), parse_double(rv)))
            except EvalError:
                raise EvalError("It's illegal to compare string by '>=', '>', '<', '<='") from None
        return self.test(compare(lv, rv))

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


class In(Node):
    """``IN`` / ``NOT IN`` a list of strings: unknown for a missing property."""

    __slots__ = ("negated", "operand", "values")
    boolean = True

    def __init__(self, operand: Property, values: list[str], negated: bool) -> None:
        self.operand, self.values, self.negated = operand, frozenset(values), negated
        self.depth = 2

    def evaluate(self, props: Properties) -> Any:
        value = self.operand.evaluate(props)
        if type(value) is not str:
            return None
        return (value in self.values) is not self.negated

    def __str__(self) -> str:
        items = ", ".join(java_repr(v) for v in sorted(self.values))
        return f"({self.operand} {'NOT IN' if self.negated else 'IN'} ({items}))"


_TEXT_TESTS = {"CONTAINS": lambda s, t: t in s, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}


class TextTest(Node):
    """CONTAINS / STARTSWITH / ENDSWITH and their NOT forms: FALSE (never unknown) when the
    value is missing or not a string, or the searched string is empty."""

    __slots__ = ("negated", "op", "operand", "search", "test")
    boolean = True

    def __init__(self, operand: Node, op: str, search: str, negated: bool) -> None:
        self.operand, self.op, self.search, self.negated = operand, op, search, negated
        self.test = _TEXT_TESTS[op]
        self.depth = operand.depth + 1

    def evaluate(self, props: Properties) -> Any:
        if not self.search:
            return False
        value = self.operand.evaluate(props)
        if type(value) is not str:
            return False
        return bool(self.test(value, self.search)) is not self.negated

    def __str__(self) -> str:
        return f"({self.operand} {'NOT ' if self.negated else ''}{self.op} {java_repr(self.search)})"
