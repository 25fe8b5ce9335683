"""RocketMQ's SQL92 message filter, sans-IO: ``compile_filter`` parses an expression once
(``SqlParseError`` with position and reason when it is bad); ``SqlFilter.matches`` evaluates
it on a message's properties, as RocketMQ's broker does (unknown or an evaluation error: no
match)."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import SqlParseError
from .nodes import Node
from .parser import Parser
from .values import EvalError

__all__ = ["MAX_EXPRESSION_CHARS", "SqlFilter", "SqlParseError", "compile_filter"]
# longer expressions are refused: parsing is linear but not free, and it runs on the event loop
MAX_EXPRESSION_CHARS = 16384


class SqlFilter:
    __slots__ = ("expression", "tree")

    def __init__(self, expression: str, tree: Node) -> None:
        self.expression = expression
        self.tree = tree

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        """TRUE, FALSE or None (unknown); an evaluation error raises ``EvalError``."""
        return self.tree.evaluate(properties)

    def matches(self, properties: Mapping[str, str]) -> bool:
        try:
            return self.tree.evaluate(properties) is True
        except EvalError:  # (RocketMQ logs it and drops the message: it is the data, not the filter)
            return False

    def __str__(self) -> str:
        return str(self.tree)


def compile_filter(expression: str) -> SqlFilter:
    if not expression or not expression.strip():
        raise SqlParseError("the SQL92 expression is empty")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise SqlParseError(f"the SQL92 expression is longer than {MAX_EXPRESSION_CHARS} characters")
    return SqlFilter(expression, Parser(expression).parse())
