"""Subscription filters of remoting pulls (RocketMQ's MessageSelector): a TAG expression is the
set of tag codes the store's consume-queue filter checks; a SQL92 expression is compiled once
and evaluated on each message's properties as its consumer sees them (the properties are
decoded, the body is not). Clients send their expression again with every pull: compiled
selectors are kept, most recently used first, so each is parsed once while in use.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from protocols.remoting.codes import ResponseCode
from protocols.remoting.sql92 import SqlFilter, SqlParseError, compile_filter
from protocols.remoting.tags import EXPRESSION_SQL92, EXPRESSION_TAG, subscription_codes

from .requests import BadRequest


@dataclass(frozen=True, slots=True)
class Selector:
    tag_codes: frozenset[int] | None = None  # TAG: the codes selected (None: every tag)
    sql: SqlFilter | None = None  # SQL92: the compiled expression


SELECT_ALL = Selector()


class Selectors:
    def __init__(self, *, enable_property_filter: bool = True, capacity: int = 1024,
                 capacity_chars: int = 1 << 20) -> None:
        self.enable_property_filter = enable_property_filter
        self.capacity = capacity  # selectors kept, and the length of their expressions in all
        self.capacity_chars = capacity_chars
        self._chars = 0
        self._compiled: OrderedDict[tuple[str, str], Selector] = OrderedDict()

    def get(self, expression: str | None, expression_type: str | None) -> Selector:
        """The selector of a subscription; BadRequest (SUBSCRIPTION_PARSE_FAILED with the
        parser's message) when it cannot be built."""
        kind = expression_type or EXPRESSION_TAG  # (RocketMQ: null or empty means TAG)
        key = (kind, expression or "")
        selector = self._compiled.get(key)
        if selector is not None:
            self._compiled.move_to_end(key)
            return selector
        selector = self._build(kind, expression)
        self._compiled[key] = selector
        self._chars += len(key[1])
        while len(self._compiled) > self.capacity or self._chars > self.capacity_chars:
            (_, dropped), _ = self._compiled.popitem(last=False)
            self._chars -= len(dropped)
        return selector

    def __len__(self) -> int:
        return len(self._compiled)

    def _build(self, kind: str, expression: str | None) -> Selector:
        if kind == EXPRESSION_TAG:
            codes = subscription_codes(expression)
            return SELECT_ALL if codes is None else Selector(tag_codes=codes)
        if kind != EXPRESSION_SQL92:
            raise BadRequest(f"expression type {kind} is not supported (TAG or SQL92)",
                             ResponseCode.SUBSCRIPTION_PARSE_FAILED)
        if not self.enable_property_filter:  # (RocketMQ's answer with enablePropertyFilter=false)
            raise BadRequest("The broker does not support consumer to filter message by SQL92 "
                             "(remoting_enable_property_filter is off)", ResponseCode.SYSTEM_ERROR)
        try:
            return Selector(sql=compile_filter(expression or ""))
        except SqlParseError as exc:
            raise BadRequest(f"the SQL92 expression does not parse: {exc}", exc.response_code) from None
