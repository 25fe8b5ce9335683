"""The SQL92 filter language of RocketMQ (its SelectorParser.jj grammar, from ActiveMQ's
selectors), tokenised and parsed by hand into ``nodes``.

Precedence, loosest first: OR; AND; ``=``, ``<>``, ``IS [NOT] NULL``; ``>``, ``>=``, ``<``,
``<=``, ``[NOT] BETWEEN``, ``[NOT] IN``, ``[NOT] CONTAINS|STARTSWITH|ENDSWITH``; unary ``+``,
``-``, NOT. Keywords are case-insensitive; identifiers are ASCII letters, digits, ``_`` and
``$``; strings are single-quoted with ``''`` for a quote; ``--`` and ``/* */`` comments.
The checks RocketMQ makes while building the tree (what may be compared, BETWEEN bounds in
order, IN on a property...) are made here too, so the same expressions are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import SqlParseError
from .nodes import (
    BooleanCast,
    Constant,
    Equal,
    In,
    Logic,
    Negate,
    Node,
    Not,
    Order,
    Property,
    TextTest,
)
from .values import DOUBLE_MIN_VALUE, INT_MAX, LONG_MAX, EvalError, Int32, compare, is_number

KEYWORDS = ("NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH",
            "ENDSWITH")
MAX_DEPTH = 100  # deeper trees are refused (the evaluation recurses)
MAX_NESTING = 40  # parentheses and unary operators within each other (the parser recurses)
_DESCRIBE = {"DECIMAL": "<integer>", "FLOAT": "<decimal number>", "STRING": "<string>", "ID": "<property name>",
             "EOF": "<end of input>"}
# JavaCC picks the longest match, the first declared on a tie (keywords before identifiers)
_TOKENS = [
    ("FLOAT", r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"),
    ("DECIMAL", r"(?:0|[1-9][0-9]*)[lL]?"),
    ("STRING", r"'(?:''|[^'])*'"),
    ("ID", r"[a-zA-Z_$][a-zA-Z0-9_$]*"),
    ("OP", r"<>|<=|>=|[=<>(),+-]"),
]
_TOKEN_RES = [(kind, re.compile(pattern)) for kind, pattern in _TOKENS]
_SPACE = re.compile(r"[ \t\n\r\f]+")
_LINE_COMMENT = re.compile(r"--[^\n\r]*(?:\r\n|\n|\r)")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_COMPARISONS = (">", ">=", "<", "<=")
_TEXT_OPS = ("CONTAINS", "STARTSWITH", "ENDSWITH")


@dataclass(slots=True)
class Token:
    kind: str  # FLOAT DECIMAL STRING ID OP EOF, or a keyword
    text: str
    pos: int
    key: str = ""  # what the parser matches: the text of an operator, else the kind

    def describe(self) -> str:
        return "end of input" if self.kind == "EOF" else f'"{self.text}"'


def _position(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos, end = 0, len(text)
    while pos < end:
        skip = _SPACE.match(text, pos) or _LINE_COMMENT.match(text, pos) or _BLOCK_COMMENT.match(text, pos)
        if skip is not None:
            pos = skip.end()
            continue
        best: Token | None = None
        for kind, pattern in _TOKEN_RES:
            m = pattern.match(text, pos)
            if m is not None and (best is None or len(m.group()) > len(best.text)):
                best = Token(kind, m.group(), pos)
        if best is None:
            what = {"'": "a string is not terminated", "/": "a comment is not terminated, or a stray '/'"}.get(
                text[pos], f"unexpected {text[pos]!r}")
            raise SqlParseError(f"Lexical error at {_position(text, pos)}: {what}")
        if best.kind == "ID" and best.text.upper() in KEYWORDS:
            best.kind = best.text.upper()
        best.key = best.text if best.kind == "OP" else best.kind
        tokens.append(best)
        pos += len(best.text)
    tokens.append(Token("EOF", "", end, "EOF"))
    return tokens


class Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.nesting = 0
        self.expected: list[str] = []  # what the parser looked for at the current token

    # -- tokens --------------------------------------------------------------------------------
    @property
    def token(self) -> Token:
        return self.tokens[self.i]

    def at(self, *kinds: str, ahead: int = 0) -> bool:
        if ahead:
            return self.tokens[min(self.i + ahead, len(self.tokens) - 1)].key in kinds
        self.expected += kinds
        return self.tokens[self.i].key in kinds

    def take(self, *kinds: str) -> Token:
        if not self.at(*kinds):
            self.fail()
        token = self.token
        self.i += 1
        self.expected = []
        return token

    def fail(self) -> None:
        wanted = ", ".join(_DESCRIBE.get(k, f'"{k}"') for k in dict.fromkeys(self.expected))
        raise SqlParseError(f"Encountered {self.token.describe()} at {_position(self.text, self.token.pos)}. "
                            f"Was expecting one of: {wanted}")

    def error(self, token: Token, message: str) -> SqlParseError:
        return SqlParseError(f"{message} (at {_position(self.text, token.pos)})")

    def checked(self, node: Node, token: Token) -> Node:
        if node.depth > MAX_DEPTH:
            raise self.error(token, f"the expression nests deeper than {MAX_DEPTH} levels")
        return node

    # -- grammar -------------------------------------------------------------------------------
    def parse(self) -> Node:
        first = self.token
        node = self.or_expression()
        # RocketMQ's grammar stops after the first complete expression and ignores the rest
        # ("a = 1 AMD b = 2" selects by a = 1): refused here rather than half applied
        self.take("EOF")
        return self.as_boolean(node, first)

    def as_boolean(self, node: Node, token: Token) -> Node:
        if node.boolean:
            return node
        if isinstance(node, Property):
            return BooleanCast(node)
        raise self.error(token, f"Expression will not result in a boolean value: {node}")

    def logic(self, keyword: str, operand) -> Node:
        first = self.token
        node = operand()
        if not self.at(keyword):
            return node
        operands = [self.as_boolean(node, first)]
        while self.at(keyword):
            self.take(keyword)
            token = self.token
            operands.append(self.as_boolean(operand(), token))
        return self.checked(Logic(operands, keyword == "AND"), first)

    def or_expression(self) -> Node:
        return self.logic("OR", self.and_expression)

    def and_expression(self) -> Node:
        return self.logic("AND", self.equality)

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            token = self.token
            if self.at("=", "<>"):
                self.take("=", "<>")
                right = self.comparison()
                self.check_equal(left, right, token)
                left = Equal(left, right) if token.text == "=" else Not(Equal(left, right))
            elif self.at("IS"):
                self.take("IS")
                negated = self.at("NOT") and self.take("NOT") is not None
                self.take("NULL")
                left = Equal(left, Constant(None))
                left = Not(left) if negated else left
            else:
                return left
            left = self.checked(left, token)

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            token = self.token
            negated = self.at("NOT") and self.at("BETWEEN", "IN", *_TEXT_OPS, ahead=1)
            if negated:
                self.take("NOT")
            if not negated and self.at(*_COMPARISONS):
                op = self.take(*_COMPARISONS).text
                right = self.unary()
                left = self.order(left, op, right, token)
            elif self.at(*_TEXT_OPS):
                op = self.take(*_TEXT_OPS).kind
                left = TextTest(left, op, self.string(), negated)
            elif self.at("BETWEEN"):
                self.take("BETWEEN")
                low = self.unary()
                self.take("AND")
                high = self.unary()
                left = self.between(left, low, high, negated, token)
            elif self.at("IN"):
                self.take("IN")
                if not isinstance(left, Property):
                    raise self.error(token, f"Expected a property for In expression, got: {left}")
                self.take("(")
                values = [self.string()]
                while self.at(","):
                    self.take(",")
                    values.append(self.string())
                self.take(")")
                left = In(left, values, negated)
            else:
                return left
            left = self.checked(left, token)

    def unary(self) -> Node:
        token = self.token
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(token, f"parentheses and unary operators nest deeper than {MAX_NESTING} levels")
        try:
            if self.at("+"):
                self.take("+")
                return self.unary()
            if self.at("-"):
                self.take("-")
                return self.checked(Negate(self.unary()), token)
            if self.at("NOT"):
                self.take("NOT")
                operand = self.token
                return self.checked(Not(self.as_boolean(self.unary(), operand)), token)
            return self.primary()
        finally:
            self.nesting -= 1

    def primary(self) -> Node:
        if self.at("("):
            self.take("(")
            node = self.or_expression()
            self.take(")")
            return node
        if self.at("ID"):
            return Property(self.take("ID").text)
        if self.at("STRING"):
            return Constant(self.string())
        if self.at("DECIMAL"):
            return Constant(self.decimal(self.take("DECIMAL")))
        if self.at("FLOAT"):
            return Constant(self.floating(self.take("FLOAT")))
        if self.at("TRUE", "FALSE", "NULL"):
            return Constant({"TRUE": True, "FALSE": False, "NULL": None}[self.take("TRUE", "FALSE", "NULL").kind])
        self.fail()
        raise AssertionError  # (fail raises)

    def string(self) -> str:
        return self.take("STRING").text[1:-1].replace("''", "'")

    def decimal(self, token: Token) -> int:
        value = int(token.text.rstrip("lL"))
        if value > LONG_MAX:
            raise self.error(token, f"{token.text} is out of the range of a long")
        return Int32(value) if value <= INT_MAX else value

    def floating(self, token: Token) -> float:
        value = float(token.text)
        if value == float("inf"):
            raise self.error(token, f"{token.text} is greater than 1.7976931348623157E308")
        if value < DOUBLE_MIN_VALUE:  # (as RocketMQ: 0.0 and other float zeros are refused)
            raise self.error(token, f"{token.text} is less than 4.9E-324")
        return value

    # -- RocketMQ's construction checks ----------------------------------------------------------
    def comparable(self, node: Node, token: Token) -> None:
        """Only numbers (constants, properties, negations) can be ordered."""
        if isinstance(node, Constant):
            if not is_number(node.value):
                raise self.error(token, f"Value '{node}' cannot be compared.")
        elif node.boolean:
            raise self.error(token, f"Value '{node}' cannot be compared.")

    def order(self, left: Node, op: str, right: Node, token: Token) -> Node:
        self.comparable(left, token)
        self.comparable(right, token)
        return Order(left, op, right)

    def check_equal(self, left: Node, right: Node, token: Token) -> None:
        for node in (left, right):
            if isinstance(node, Constant) and node.value is None:
                raise self.error(token, "'NULL' cannot be compared (write IS NULL).")
        if isinstance(left, Constant) and isinstance(right, Constant) and left.boolean and not right.boolean:
            raise self.error(token, f"'{left}' cannot be compared with '{right}'")

    def between(self, value: Node, low: Node, high: Node, negated: bool, token: Token) -> Node:
        if negated:
            return Logic([self.order(value, "<", low, token), self.order(value, ">", high, token)], False)
        if isinstance(low, Constant) and isinstance(high, Constant):
            if low.value is None or high.value is None:
                raise self.error(token, "Illegal values of between, values can not be null!")
            try:
                reversed_bounds = compare(high.value, low.value) < 0
            except EvalError as exc:
                raise self.error(token, f"Illegal values of between: {exc}") from None
            if reversed_bounds:
                raise self.error(token, f"Illegal values of between, left value({low}) must less than or equal to "
                                        f"right value({high})")
        return Logic([self.order(value, ">=", low, token), self.order(value, "<=", high, token)], True)
