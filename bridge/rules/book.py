"""Where rule definitions are kept: the store's ``rules`` table (name -> the definition's JSON),
a meta table, so definitions go through the store's log with the other durable meta and are
on every replica of a replicated store."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any, Protocol

from .definition import RuleDefinition, parse_definition

log = logging.getLogger("tidemq.rules")

TABLE = "rules"


class DefinitionTable(Protocol):
    """A durable str -> bytes table (``store.KvTable``)."""

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]: ...


class RuleBook:
    def __init__(self, table: DefinitionTable) -> None:
        self._table = table

    def stored(self) -> Iterator[RuleDefinition]:
        """The stored definitions; one this version cannot read is logged and left as it is."""
        for name, raw in self._table.items():
            try:
                yield parse_definition(name, json.loads(raw))
            except ValueError as exc:  # (RuleDefinitionError too)
                log.error("stored rule not started rule=%s error=%s", name, exc)

    def save(self, rule: RuleDefinition) -> None:
        """Written before the rule runs (StoreError: it was not, and does not run)."""
        self._table.put(rule.name, encode(rule.source_json))

    def delete(self, name: str) -> None:
        self._table.delete(name)


def encode(definition: dict[str, Any]) -> bytes:
    return json.dumps(definition, sort_keys=True, separators=(",", ":")).encode()
